"""Every row format draftsmith reads or writes, and both data contracts.

* `data.sources`: which files a path stands for (JSONL, JSONL.gz, JSON arrays, Parquet, Arrow,
  `datasets` dirs, generate output dirs, folders) and their rows, streaming; the split rule;
* `data.conversation`: the one Conversation model and id rule; `data.reasoning`: the one splitter;
* `data.prompts`: conversation rows as prompts; `data.generated`: contract 1 (generated rows);
  `data.tokenized`: contract 2 (tokenized rows).
"""
