"""The embedded default a laptop runs offline: the verifiable arithmetic task, its character-level
tokenizer, the base model the project builds from them, the train/eval datasets a recipe names,
the rewards that score completions, and mean@16 evaluation. Imports nothing else of ``runners``."""
