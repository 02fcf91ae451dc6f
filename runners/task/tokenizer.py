"""A character-level tokenizer built with ``tokenizers`` and saved as a Hugging Face tokenizer.

Every printable ASCII character is one token, and the format's tags are single tokens,
so the interruption phrase and any answer can be written. Tags are ordinary (not
special) tokens: TRL decodes completions with ``skip_special_tokens=True``, and the
reward must still see them.
"""

from __future__ import annotations

import string
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from runners.task.tasks import ANSWER_CLOSE, ANSWER_OPEN, THINK_CLOSE, THINK_OPEN

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
TAGS = [THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE]
CHARS = sorted(set(string.printable) - set("\x0b\x0c\r"))


def build_tokenizer(out_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """Build (and optionally save) the char-level tokenizer; loadable with ``AutoTokenizer``."""
    vocab = {tok: i for i, tok in enumerate([PAD, EOS, UNK, *TAGS, *CHARS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_tokens(TAGS)  # matched before pre-tokenisation, so "<think>" is one token
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )
    if out_dir is not None:
        fast.save_pretrained(str(out_dir))
    return fast
