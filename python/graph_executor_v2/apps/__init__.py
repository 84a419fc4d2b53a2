"""The command-line jobs (``python -m graph_executor_v2 train-digits | train-gpt``), apart from the library layers
they use: the Trainer, the models, the datasets."""
