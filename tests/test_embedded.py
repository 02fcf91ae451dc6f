"""The embedded default: tasks, tokenizer, rewards, the base model, and real-model/dataset loading."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from runners.recipe import recipe_from_dict
from runners.task.basemodel import ensure_base_model, load_model_and_tokenizer
from runners.task.rewards import exact_match, format_reward, math_verify_reward
from runners.task.tasks import ArithmeticTask, load_jsonl, solve
from runners.task.tokenizer import build_tokenizer


def test_splits_are_disjoint_stable_and_graded():
    task = ArithmeticTask(n_train=3000, n_val=150)
    train, val = task.splits()
    assert len(train) == 3000 and len(val) == 150
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in val}
    assert task.splits() == (train, val)  # deterministic
    assert ArithmeticTask(n_train=3000, n_val=150, seed=1).splits()[1] != val
    assert {r["difficulty"] for r in train} == {1, 2, 3}  # 2..4 operands
    for r in val[:20]:
        assert str(solve(r["problem"])) == r["answer"]


def test_demonstrations_are_wrong_at_the_configured_rate():
    task = ArithmeticTask(min_operands=2, max_operands=2, demo_error_rate=0.3, n_val=20)
    rng = random.Random(0)
    train, _ = task.splits()
    demos = [(task.demonstration(r["problem"], rng), r["answer"]) for r in train[:2000]]
    wrong = sum(f"<answer>{a}</answer>" not in d for d, a in demos) / len(demos)
    assert 0.25 < wrong < 0.35
    assert all(d.startswith("<think>") and d.endswith("</answer>") for d, _ in demos)


def test_tokenizer_round_trips_through_autotokenizer(tmp_path):
    build_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    text = "Q: 12+3-4\n<think>12+3=15 15-4=11</think><answer>11</answer>"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    assert tok.unk_token_id not in ids
    for tag in ("<think>", "</think>", "<answer>", "</answer>"):
        assert len(tok(tag, add_special_tokens=False)["input_ids"]) == 1
    phrase = "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"
    assert tok.decode(tok(phrase)["input_ids"], skip_special_tokens=True) == phrase


def test_too_small_a_problem_space_is_refused():
    with pytest.raises(ValueError, match="n_val = 150 leaves too few distinct problems"):
        ArithmeticTask(min_operands=2, max_operands=2, max_operand=5, n_val=150)


def test_rewards():
    good = "<think>2+2=4</think><answer>4</answer>"
    assert exact_match(None, [good, "<answer>5</answer>", "4"], answer=["4", "4", "4"]) == [1.0, -1.0, -1.0]
    assert format_reward(None, [good, "<answer>4</answer>", "<think>x</think> <answer>1</answer>"]) == [1, -1, 1]
    conversational = [[{"role": "assistant", "content": good}]]
    assert exact_match(None, conversational, answer=["4"]) == [1.0]
    got = math_verify_reward(
        None, ["<think></think><answer>\\frac{1}{2}</answer>", "<answer>0.3</answer>"], answer=["0.5", "1/2"]
    )
    assert got == [1.0, -1.0]


def test_rouge_l_reward_scores_sentences_and_composes_by_weight():
    from runners.recipe import recipe_from_dict
    from runners.rl.train import reward_setup
    from runners.task.rewards import correct, rouge_l_reward

    ref = "the cat sat on the mat"
    got = rouge_l_reward(
        None,
        ["<think>x</think><answer>The cat sat on the mat</answer>", "the cats sat", "a dog", "<answer></answer>"],
        answer=[ref] * 4,
    )
    # identical (case-insensitive): F1 1; "the cat(s) sat" (stemmed): LCS 3, P 3/3, R 3/6, F1 2/3; no overlap: 0
    assert got == pytest.approx([1.0, 2 * (2 / 3) - 1, -1.0, -1.0])
    assert correct("<answer>the cat is on the mat</answer>", ref, "rouge_l")  # F1 5/6 > 0.5
    assert not correct("<answer>the cat</answer>", ref, "rouge_l")  # F1 0.5
    recipe = recipe_from_dict({"model": {"size": "tiny"}, "data": {"reward": {"rouge_l": 1.0, "format": 0.2}}})
    funcs, weights = reward_setup(recipe)
    assert [f.__name__ for f in funcs] == ["rouge_l_reward", "format_reward"] and weights == [1.0, 0.2]


def test_base_model_is_a_standard_checkpoint_with_headroom(tiny_base):
    info = json.loads((tiny_base / "build_info.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(tiny_base)
    tok = AutoTokenizer.from_pretrained(tiny_base)
    assert not model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert tok.decode(tok("Q: 1+2\n")["input_ids"]) == "Q: 1+2\n"
    val = info["val"]
    assert 0.0 < val["mean_at_k"] < val["pass_at_k"]  # RL has something to sharpen


def test_a_change_to_the_build_code_is_reviewed_against_build_version():
    """The base-model cache and run identities trust BUILD_VERSION; a change to the code that decides
    what is built (not its comments or docstrings) fails here until someone decides whether the
    version must be bumped (stale cached models otherwise survive it) and records the fingerprint."""
    from runners.task.basemodel import build_fingerprint
    from runners.task.sizes import BUILD_FINGERPRINT, BUILD_VERSION

    now = build_fingerprint()
    assert now == BUILD_FINGERPRINT, (
        f"the base-model build code changed (fingerprint {now}, recorded {BUILD_FINGERPRINT}): if what a "
        f"build makes changes, bump BUILD_VERSION (now {BUILD_VERSION}); then set BUILD_FINGERPRINT = {now!r} "
        "in runners/task/basemodel.py"
    )


def test_the_build_fingerprint_reads_the_same_on_every_python_version():
    """A def and an f-string, as Python 3.10 to 3.13 each parse them (ast.dump's text differs on each of
    3.11, 3.12 and 3.13, and with it the fingerprint: the test above failed on Python 3.12)."""
    import ast

    from runners.task.basemodel import syntax_text

    tree = ast.parse("def f(x):\n    return f\"{x} {', '.join(x)}\"\n")
    assert syntax_text(tree) == (
        "Module(body=[FunctionDef(name='f', args=arguments(args=[arg(arg='x')]), body=[Return(value=JoinedStr("
        "values=[FormattedValue(value=Name(id='x', ctx=Load()), conversion=-1), Constant(value=' '), "
        "FormattedValue(value=Call(func=Attribute(value=Constant(value=', '), attr='join', ctx=Load()), "
        "args=[Name(id='x', ctx=Load())]), conversion=-1)]))])])"
    )


def test_the_base_model_build_reports_its_progress_with_the_time_left(tiny_base, cache_dir):
    """A build takes minutes on a CPU: it says so at every tenth of its SFT steps, with the time left,
    and before it evaluates the result."""
    from tests.conftest import BUILD_LOG as log_file

    BUILD_LOG = (cache_dir / log_file).read_text().splitlines()  # the session's build, by whichever worker
    steps = [line for line in BUILD_LOG if line.startswith("  SFT step ")]
    assert BUILD_LOG[1] == "  SFT: 150 steps of 32 demonstrations", BUILD_LOG
    tenths = [f"  SFT step {15 * k}/150 ({10 * k}%), " for k in range(1, 11)]  # (and more on a slow machine)
    assert all(any(line.startswith(t) for line in steps) for t in tenths), steps
    assert all("left" in line for line in steps[:-1]) and steps[-1].startswith(tenths[-1])
    assert any(line.startswith("  SFT done; evaluating the base model on 100 prompts") for line in BUILD_LOG)


def test_base_model_is_cached_by_config(tiny_base, cache_dir):
    stamp = (tiny_base / "model.safetensors").stat().st_mtime_ns
    again = ensure_base_model("tiny", ArithmeticTask(), cache_dir / "base-models", log=pytest.fail)
    assert again == tiny_base and (again / "model.safetensors").stat().st_mtime_ns == stamp
    other = ArithmeticTask(max_operand=5)
    from runners.task.sizes import base_model_path

    assert base_model_path("tiny", other, cache_dir / "base-models") != tiny_base


def test_local_model_and_jsonl_dataset_train_through_the_same_path(tiny_base, tmp_path):
    from runners.rl.train import train

    data = tmp_path / "data.jsonl"
    rng = random.Random(0)
    with data.open("w") as fh:
        for _ in range(64):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            fh.write(json.dumps({"problem": f"{a}+{b}", "answer": str(a + b)}) + "\n")
    recipe = recipe_from_dict(
        {
            "name": "local",
            "model": {"size": None, "path": str(tiny_base)},
            "data": {"path": str(data)},
            "batch": {"prompts": 2, "generations": 4, "micro_batch": 8},
            "length": {"control": "none", "max_tokens": 24},
            "train": {"steps": 2, "save_every": 2},
            "eval": {"prompts": 8, "every": 2, "samples": 4},
        }
    )
    final = train(recipe, tmp_path / "run", log=lambda m: None)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 2]
    # mean@k over 8 prompts x 4 samples is a count of correct samples out of 32, at every evaluation
    assert all(abs(x["val/mean_at_16"] * 32 - round(x["val/mean_at_16"] * 32)) < 1e-6 for x in lines)
    assert final["compute/tokens"] > 0
    # only the file's problems reach the model, with the file's answers (the embedded task's
    # problems have 2-5 operands and would not be in this set)
    rows = {json.loads(x)["problem"]: json.loads(x)["answer"] for x in data.read_text().splitlines()}
    samples = [
        x for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines() for x in json.loads(line)["samples"]
    ]
    assert samples
    for x in samples:
        problem = x["prompt"].removeprefix("Q: ").strip()
        assert problem in rows and x["answer"] == rows[problem], x
    assert lines[-1]["val/prompts"] == 8
    # compute as the README defines it: 2 steps x 2 prompts x 4 completions; (2 + 6 x 1 epoch) x params x tokens
    model, _ = load_model_and_tokenizer(tiny_base)
    n_params = sum(p.numel() for p in model.parameters())
    assert final["compute/samples"] == 16
    assert final["compute/flops"] == pytest.approx(8 * n_params * final["compute/tokens"])
    # the best step by mean@16 is kept as a loadable model in best/
    best = json.loads((tmp_path / "run" / "best" / "best.json").read_text())
    top = max(lines, key=lambda x: x["val/mean_at_16"])
    assert best == {"step": top["step"], "val/mean_at_16": top["val/mean_at_16"]}
    assert final["val/best_mean_at_16"] == top["val/mean_at_16"]
    load_model_and_tokenizer(tmp_path / "run" / "best")


def test_loading_errors_name_the_file_and_field(tiny_base, tmp_path):
    with pytest.raises(FileNotFoundError, match="no such directory"):
        load_model_and_tokenizer(tmp_path / "missing")
    no_tok = tmp_path / "no-tokenizer"
    shutil.copytree(tiny_base, no_tok, ignore=shutil.ignore_patterns("tokenizer*"))
    with pytest.raises(FileNotFoundError, match=r"no-tokenizer: no tokenizer"):
        load_model_and_tokenizer(no_tok)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": "2+2"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl line 2: missing field 'answer'"):
        load_jsonl(bad)
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_jsonl(tmp_path / "none.jsonl")


@pytest.fixture(scope="module")
def local_encoder(tmp_path_factory) -> Path:
    """A small BERT encoder with a word-level vocabulary, built here (no model can be downloaded)."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    path = tmp_path_factory.mktemp("encoder")
    words = "the cat sat on mat a dog ran away paris is capital of france berlin germany".split()  # noqa: SIM905
    tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])})
    tok.model_max_length = 512
    config = BertConfig(
        vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _bertscore_f1_by_hand(model_dir: Path, cand: str, ref: str) -> float:
    """BERTScore F1 from its definition (Zhang et al. 2020): greedy cosine matching of the last
    layer's token embeddings, [CLS]/[SEP] left out."""
    from transformers import AutoModel

    tok, model = AutoTokenizer.from_pretrained(model_dir), AutoModel.from_pretrained(model_dir).eval()

    def emb(text: str) -> torch.Tensor:
        with torch.no_grad():
            h = model(**tok(text, return_tensors="pt")).last_hidden_state[0, 1:-1]
        return torch.nn.functional.normalize(h, dim=-1)

    sim = emb(cand) @ emb(ref).T
    p, r = sim.max(1).values.mean().item(), sim.max(0).values.mean().item()
    return 2 * p * r / (p + r)


def test_bertscore_reward_uses_a_local_encoder_and_composes_by_weight(local_encoder, tmp_path):
    from runners.recipe import RecipeError, recipe_from_dict
    from runners.rl.train import reward_setup
    from runners.task.rewards import BertScoreReward

    ref = "paris is the capital of france"
    other = "berlin is the capital of germany"
    reward = BertScoreReward(str(local_encoder), threshold=0.5)
    cands = [f"<think>x</think><answer>{ref}</answer>", "<answer> </answer>", other, "capital of germany"]
    got = reward(None, cands, answer=[ref] * 4)
    f1 = [_bertscore_f1_by_hand(local_encoder, c, ref) for c in (other, "capital of germany")]
    assert all(0.5 < x < 0.999 for x in f1) and abs(f1[0] - f1[1]) > 1e-3  # the encoder tells them apart
    # identical: F1 1; empty answer: -1; the others in their own places, batched and padded as one
    assert got == pytest.approx([1.0, -1.0, (f1[0] - 0.5) / 0.5, (f1[1] - 0.5) / 0.5], abs=1e-4)

    data = {"reward": {"bertscore": 1.0, "format": 0.2}, "bertscore": {"model": str(local_encoder)}}
    funcs, weights = reward_setup(recipe_from_dict({"model": {"size": "tiny"}, "data": data}))
    assert isinstance(funcs[0], BertScoreReward) and funcs[0].threshold == 0.9 and weights == [1.0, 0.2]

    def refused(data: dict) -> str:
        with pytest.raises(RecipeError) as e:
            recipe_from_dict({"model": {"size": "tiny"}, "data": data})
        return str(e.value)

    assert "cannot download one" in refused({"reward": {"bertscore": 1.0}})
    assert "not a local Hugging Face model folder" in refused(
        {"reward": {"bertscore": 1.0}, "bertscore": {"model": str(tmp_path / "roberta-large")}}
    )
    assert "data.reward has no bertscore" in refused({"bertscore": {"model": str(local_encoder)}})


def test_the_sizes_span_the_range_and_the_old_ones_keep_their_builds(tiny_base):
    """Issue 44's sizes: >= 5 built as medium is (large with twice the SFT steps), spanning >= 30x in
    parameters, counted from their shape as the built model counts them; adding them left the recorded
    builds' keys (loo-gpu2..6's medium) as they were."""
    from runners.recipe import raw_recipe
    from runners.task.sizes import SIZES, build_key, parameter_count

    family = ["nano", "micro", "mini", "medium", "large"]
    counts = [parameter_count(s) for s in family]
    assert counts == sorted(counts) and counts[-1] / counts[0] >= 30, counts
    assert {SIZES[s].sft_batch for s in family} == {256}
    # one SFT, twice as long for the largest (with 1,500 steps it started below mini: results/scale-probe)
    assert [SIZES[s].sft_steps for s in family] == [1500, 1500, 1500, 1500, 3000]
    info = json.loads((tiny_base / "build_info.json").read_text())
    assert info["parameters"] == parameter_count("tiny") and info["device"] == "cpu"
    assert 0 < info["sft_seconds"] < info["seconds"] and info["sft_steps"] == SIZES["tiny"].sft_steps
    gpu_task = recipe_from_dict(raw_recipe("scalerl-gpu4")).data.task
    assert build_key("medium", gpu_task) == "46f3dbcae05a"  # results/loo-gpu*/campaign.log built medium-46f3dbcae05a


def test_a_size_whose_build_changes_gives_its_runs_new_identities(monkeypatch):
    """A run's identity carries its base model's build key, so a size whose SFT changes (large's went from
    1,500 to 3,000 steps) gives its runs new identities: a finished run trained on the old build is not
    reused as if it were the new one. Every other size's runs keep theirs, and a model.path run has none."""
    import copy
    from dataclasses import replace

    from runners.identity import run_key
    from runners.recipe import raw_recipe
    from runners.task import sizes

    raw = raw_recipe("scalerl-gpu4")

    def key(size: str | None) -> str:
        r = copy.deepcopy(raw)
        r["model"].update(size=size, path=None if size else "/models/mine")
        return run_key(recipe_from_dict(r))

    before = {s: key(s) for s in ("large", "medium", None)}
    monkeypatch.setitem(sizes.SIZES, "large", replace(sizes.SIZES["large"], sft_steps=1500))
    after = {s: key(s) for s in before}
    assert after["large"] != before["large"]
    assert after["medium"] == before["medium"] and after[None] == before[None]
