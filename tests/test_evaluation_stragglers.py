"""Evaluation's generate (runners.task.evaluation.generate): a batch stops once all but a few of its
rows have ended, and those few go on alone, so one sample that never ends does not keep a whole
batch of 1,024 generating to the length cap (an evaluation of 1.5 s took 30-49 s on the CPU
default). The rows that ended first must come out the very same; every row must still end where
plain ``generate`` would let it: at EOS or at the cap."""

from __future__ import annotations

import torch

from runners.task.evaluation import generate


def _setup(random_model_dir):
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(random_model_dir)
    tok.padding_side = "left"
    model = LlamaForCausalLM.from_pretrained(random_model_dir).eval()
    enc = tok(["Q: 1+2\n", "Q: 13-4+7\n"], return_tensors="pt", padding=True, add_special_tokens=False)
    sampling = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=100)
    sampling |= dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    return model, enc, sampling, tok


@torch.no_grad()
def test_stragglers_go_on_alone_and_the_rows_that_ended_first_are_unchanged(random_model_dir):
    model, enc, sampling, tok = _setup(random_model_dir)
    n = 16
    torch.manual_seed(0)
    plain = generate(model, enc, sampling, n, stragglers=None)
    torch.manual_seed(0)
    early = generate(model, enc, sampling, n, stragglers=0.75)  # stop once a quarter of the rows have ended

    def ended_at(ids):  # index of the first EOS of each row, or its length where it has none
        hit = ids == tok.eos_token_id
        return torch.where(hit.any(1), hit.int().argmax(1), torch.full((len(ids),), ids.shape[1]))

    a, b = ended_at(plain), ended_at(early)
    assert len(early) == len(plain) == 2 * n
    k = len(a) - int(0.75 * len(a))  # rows ended when the batch stops
    stop = int(torch.sort(a).values[k - 1])  # the step at which that many plain rows had ended
    first = a <= stop
    assert first.sum() >= k and not first.all(), a  # some rows ended before the stop, some after
    for i in first.nonzero().view(-1).tolist():  # the rows that ended before the stop: the same tokens
        assert torch.equal(plain[i, : a[i] + 1], early[i, : b[i] + 1]), i
    cap = sampling["max_new_tokens"]
    assert (a == cap).any()  # some plain rows never end: they run to the cap, and so must theirs with stragglers
    for ids, at in ((early, b), (plain, a)):  # every row ends at EOS, only padding after it, or runs to the cap
        assert ids.shape[1] == cap
        for i, x in enumerate(at.tolist()):
            assert (ids[i, x + 1 :] == tok.pad_token_id).all(), (i, x, ids[i])
    assert (b[~first] > stop).all()  # the stragglers went on past the stop


@torch.no_grad()
def test_without_stragglers_the_batch_is_plain_generate(random_model_dir):
    model, enc, sampling, _ = _setup(random_model_dir)
    torch.manual_seed(1)
    ours = generate(model, enc, sampling, 2, stragglers=None)
    torch.manual_seed(1)
    out = model.generate(**enc, **sampling, num_return_sequences=2)
    assert torch.equal(ours, out[:, enc["input_ids"].shape[1] :])


@torch.no_grad()
def test_a_tokenizer_without_eos_generates_as_plain_generate_does(random_model_dir):
    """No EOS id: no row ends early, so nothing straggles; the batch is plain ``generate``."""
    model, enc, sampling, _ = _setup(random_model_dir)
    sampling = {**sampling, "eos_token_id": None, "max_new_tokens": 20}
    torch.manual_seed(2)
    ours = generate(model, enc, sampling, 2)
    torch.manual_seed(2)
    out = model.generate(**enc, **sampling, num_return_sequences=2)
    assert torch.equal(ours, out[:, enc["input_ids"].shape[1] :])
