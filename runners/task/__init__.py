"""The embedded default a laptop runs offline: the verifiable arithmetic task, its character-level
tokenizer, the base model the project builds from them, and the train/eval datasets a recipe names."""
