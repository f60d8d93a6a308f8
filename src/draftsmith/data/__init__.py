"""Every row format draftsmith reads or writes, and both data contracts (generated and tokenized rows)."""
