import sys

try:
    # Importing every stage takes seconds on a busy machine; Ctrl-C then is still an interrupt.
    from draftsmith.cli import main
except KeyboardInterrupt:
    print("draftsmith: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
