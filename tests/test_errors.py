"""One test per bad input the issue lists: each raises its typed error (a SitelensError) with a
message that names the problem and the fix; the CLI prints it without a traceback and exits 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sitelens import (
    AdapterError,
    FitConfig,
    FitError,
    ModelError,
    OutputError,
    PromptTooLongError,
    SiteAdapter,
    SitelensError,
    TaskError,
    Template,
    TokenizationError,
    answer_token_id,
    encode,
    fit_alpha,
    fit_site,
    load_model,
    load_task,
    task_embedding,
    task_from_pairs,
    tiny_model,
)
from sitelens.cli import main as cli_main
from sitelens.eval.evaluation import evaluate
from sitelens.tasks import embedding_prompts, few_shot_prompts

ROOT = Path(__file__).resolve().parents[1]
TINY_FIT = ["--n-prompts", "4", "--n-shots", "2", "--n-examples", "8", "--batch-size", "4"]


@pytest.fixture(scope="module")
def task():
    return load_task("antonym")


@pytest.fixture(scope="module")
def adapter(tiny_mha, task):
    return fit_site(tiny_mha, task, n_prompts=4, n_shots=2,
                    config=FitConfig(n_examples=8, batch_size=4, eval_every=2))


def _saved(adapter, tmp_path) -> Path:
    return adapter.save(tmp_path / "ad")


def test_every_error_is_a_sitelens_error():
    for cls in (ModelError, TaskError, PromptTooLongError, TokenizationError, AdapterError,
                FitError, OutputError):
        assert issubclass(cls, SitelensError)


# ----------------------------------------------------------------------------------------------
# unknown names


def test_unknown_model_suggests_close_matches():
    with pytest.raises(ModelError) as e:
        load_model("smollm2-135m-instuct")
    msg = str(e.value)
    assert "Unknown model 'smollm2-135m-instuct'" in msg
    assert "Close matches: smollm2-135m-instruct" in msg
    with pytest.raises(ModelError, match="Close matches: tiny-random"):
        load_model("tiny-randm")


def test_unknown_task_suggests_close_matches():
    with pytest.raises(TaskError) as e:
        load_task("english_frnch")
    msg = str(e.value)
    assert "Unknown task 'english_frnch'" in msg and "Did you mean: english_french" in msg


def test_unknown_backend():
    with pytest.raises(ModelError, match="Unknown backend 'jax'"):
        tiny_model(backend="jax")


# ----------------------------------------------------------------------------------------------
# task files


@pytest.mark.parametrize(
    "content, match",
    [
        ("", r"is empty; a task file holds a JSON list"),
        ("  \n", r"is empty"),
        ("[{\"input\": \"a\", ", r"not valid JSON \(.* at line 1\); fix the file"),
        ("[]", r"the task has no items"),
        ('{"input": "a", "output": "b"}', r"expected a JSON list"),
        ('[{"input": "a"}]', r"item 0 must be an object with 'input' and 'output' keys"),
        ('[{"in": "a", "out": "b"}]', r"item 0 must be an object with 'input' and 'output' keys"),
        ('[{"input": "a", "output": ["b"]}]', r"item 0 has a non-string 'output'"),
        ('[{"input": {"x": 1}, "output": "b"}]', r"item 0 has a non-string 'input'"),
        ('[{"input": true, "output": "b"}]', r"item 0 has a non-string 'input'"),
        ('[{"input": "a", "output": " "}]', r"item 0 has an empty 'output'"),
        ('[{"input": "a", "output": "b"}, {"input": "c", "output": "d"}, {"input": "a", "output": "b"}]',
         r"1 duplicate item\(s\), first \('a', 'b'\)\. Remove them, or pass dedupe=True"),
    ],
    ids=["empty-file", "blank-file", "truncated-json", "empty-list", "not-a-list", "missing-output",
         "wrong-keys", "list-value", "dict-value", "bool-value", "blank-value", "duplicates"],
)
def test_bad_task_file(tmp_path, content, match):
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(TaskError, match=match):
        load_task(f)


def test_non_utf8_task_file(tmp_path):
    f = tmp_path / "bad.json"
    f.write_bytes(b"\xff\xfe[\x00")
    with pytest.raises(TaskError, match="not UTF-8"):
        load_task(f)


def test_bad_pairs_in_code():
    with pytest.raises(TaskError, match="duplicate"):
        task_from_pairs("t", [("a", "b"), ("a", "b"), ("c", "d"), ("e", "f")])
    with pytest.raises(TaskError, match="non-string 'output'"):
        task_from_pairs("t", [("a", None), ("c", "d"), ("e", "f")])


def test_fewer_training_items_than_shots():
    t = task_from_pairs("small", [(f"x{i}", f"y{i}") for i in range(10)])  # 7 train items
    with pytest.raises(TaskError, match=r"Asked for 20 demonstrations but only \d+ training items"):
        few_shot_prompts(t, t.test, 20)
    with pytest.raises(TaskError, match=r"has \d+ training items; 20-shot prompts need at least 21"):
        embedding_prompts(t, 5, 20)


def test_fewer_training_items_than_shots_in_fit_site(tiny_mha):
    t = task_from_pairs("small", [(f"x{i}", f"y{i}") for i in range(10)])
    with pytest.raises(TaskError, match="Use fewer shots"):
        fit_site(tiny_mha, t, n_prompts=2, n_shots=10)


# ----------------------------------------------------------------------------------------------
# tokens and context


def test_answer_tokenizing_to_nothing(tiny_mha):
    with pytest.raises(TokenizationError, match=r"The answer '' tokenizes to nothing"):
        answer_token_id(tiny_mha, "", Template(answer_prefix=""))


def test_prompt_longer_than_context(tiny_mha):
    n_ctx = tiny_mha.cfg.n_ctx
    with pytest.raises(PromptTooLongError) as e:
        encode(tiny_mha, ["x" * (n_ctx + 10)])
    assert f"but the model's context (n_ctx) is {n_ctx}" in str(e.value)
    assert "fewer or shorter demonstrations" in str(e.value)


def test_icl_prompts_longer_than_context(task):
    short = tiny_model(n_ctx=48)  # 10-shot prompts of the antonym task need ~150 tokens
    with pytest.raises(PromptTooLongError, match="n_ctx"):
        evaluate(short, task, methods=("icl",), limit=2, n_shots=10)


# ----------------------------------------------------------------------------------------------
# fitting


def test_non_finite_embedding(tiny_mha, task):
    emb = task_embedding(tiny_mha, task, n_prompts=2, n_shots=2)
    emb[0, 1, 2] = float("nan")
    with pytest.raises(FitError, match=r"has 1 non-finite value\(s\) \(inf/nan\)"):
        fit_alpha(tiny_mha, task, emb, FitConfig(n_examples=4, batch_size=4))
    emb[0, 1, 2] = float("inf")
    with pytest.raises(FitError, match="non-finite"):
        fit_alpha(tiny_mha, task, emb, FitConfig(n_examples=4, batch_size=4))


def test_non_finite_learning_rate():
    with pytest.raises(FitError, match=r"FitConfig.lr must be a positive finite number, got inf"):
        FitConfig(lr=float("inf"))
    with pytest.raises(FitError, match="lr must be"):
        FitConfig(lr=float("nan"))


def test_non_finite_loss_during_fitting(backend, task):
    model = tiny_model(backend=backend)  # a private copy: it gets poisoned
    emb = task_embedding(model, task, n_prompts=2, n_shots=2)
    with torch.no_grad():
        list(model.parameters())[-1].fill_(float("nan"))  # the unembedding: logits become nan
    with pytest.raises(FitError, match=r"Non-finite loss at step 1 while fitting α on 'antonym'"):
        fit_alpha(model, task, emb, FitConfig(n_examples=8, batch_size=4))


# ----------------------------------------------------------------------------------------------
# adapters


def test_adapter_for_another_model(adapter, tiny_mha, backend):
    adapter.check_model(tiny_mha)
    with pytest.raises(AdapterError, match=r"Adapter was fitted on .* \(weights [0-9a-f]+\) but"):
        adapter.check_model(tiny_model(seed=7, backend=backend))
    with pytest.raises(AdapterError, match=r"Adapter shape \[n_layers=2, n_heads=4, d_head=8\] does "
                                           r"not match"):
        adapter.check_model(tiny_model(n_layers=3, backend=backend))


def test_adapter_for_another_template(adapter, tiny_mha, task):
    other = Template(shot="Input: {x}\nOutput: {y}\n\n", query="Input: {x}\nOutput:")
    with pytest.raises(AdapterError, match="Adapter was fitted with template"):
        adapter.check_model(tiny_mha, other)
    with pytest.raises(AdapterError, match="Use the adapter's template or refit"):
        evaluate(tiny_mha, task, methods=("site",), adapter=adapter, limit=2, template=other)


def test_truncated_safetensors(adapter, tmp_path):
    d = _saved(adapter, tmp_path)
    f = d / "adapter.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(AdapterError, match=r"does not match the checksum in adapter.json \(truncated"):
        SiteAdapter.load(d)


def test_corrupted_safetensors_with_matching_checksum(adapter, tmp_path):
    d = _saved(adapter, tmp_path)
    garbage = b"\x00" * 64
    (d / "adapter.safetensors").write_bytes(garbage)
    meta = json.loads((d / "adapter.json").read_text())
    import hashlib

    meta["sha256"] = hashlib.sha256(garbage).hexdigest()
    (d / "adapter.json").write_text(json.dumps(meta))
    with pytest.raises(AdapterError, match="cannot be read"):
        SiteAdapter.load(d)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda b: b[: len(b) // 2], r"adapter.json is corrupted \(.*\); refit the adapter"),
        (lambda b: b"", r"adapter.json is corrupted"),
        (lambda b: b"\xff\xfe\x00garbage", r"adapter.json is corrupted \(not UTF-8 text\)"),
        (lambda b: b"[1, 2, 3]", r"no adapter metadata with a sha256 checksum"),
        (lambda b: b'{"model": "x"}', r"no adapter metadata with a sha256 checksum"),
    ],
    ids=["truncated", "empty", "binary", "not-an-object", "no-checksum"],
)
def test_corrupted_adapter_json(adapter, tmp_path, mutate, match):
    d = _saved(adapter, tmp_path)
    f = d / "adapter.json"
    f.write_bytes(mutate(f.read_bytes()))
    with pytest.raises(AdapterError, match=match):
        SiteAdapter.load(d)


def test_missing_adapter_files(adapter, tmp_path):
    with pytest.raises(AdapterError, match="is not an adapter directory"):
        SiteAdapter.load(tmp_path / "nothing")
    d = _saved(adapter, tmp_path)
    (d / "adapter.safetensors").unlink()
    with pytest.raises(AdapterError, match="needs adapter.json and adapter.safetensors"):
        SiteAdapter.load(d)


# ----------------------------------------------------------------------------------------------
# output locations (tests run as root: a FILE in the path is what makes it unwritable)


def test_unwritable_output_directory(adapter, tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a directory")
    with pytest.raises(OutputError, match=r"file.txt is a file, not a directory"):
        adapter.save(blocker / "sub")
    with pytest.raises(OutputError, match="is a file, not a directory"):
        adapter.save(blocker)


def test_a_failed_save_leaves_the_old_adapter_intact(adapter, tmp_path, monkeypatch):
    d = _saved(adapter, tmp_path)
    before = {f.name: f.read_bytes() for f in d.iterdir()}
    other = SiteAdapter(adapter.alpha * 0.5, adapter.embedding, dict(adapter.meta))

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OutputError, match="No space left on device"):
        other.save(d)
    monkeypatch.undo()
    assert {f.name: f.read_bytes() for f in d.iterdir()} == before  # no partial or temp file
    assert torch.equal(SiteAdapter.load(d).alpha, adapter.alpha)  # exact: safetensors stores the bits


def test_unwritable_bench_csv(tmp_path):
    from sitelens.pipelines.bench import append_row

    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    with pytest.raises(OutputError, match=r"Cannot write the results to .*file.txt/sub/r.csv"):
        append_row(blocker / "sub" / "r.csv", {"model": "m"})


# ----------------------------------------------------------------------------------------------
# the CLI: the message on stderr, no traceback, exit status 2


def _cli(args, tmp_path, env=None):
    """Run ``python -m sitelens.cli`` in a real subprocess."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "sitelens.cli", *args], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=120,
    )


def _assert_clean(proc, *needles):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]  # progress/log lines may come first
    assert last.startswith("sitelens: error: "), proc.stderr
    for n in needles:
        assert n in proc.stderr, proc.stderr


def test_cli_subprocess_unknown_model(tmp_path):
    proc = _cli(["eval", "--model", "smollm2-135m-instuct", "--task", "antonym",
                 "--methods", "zero-shot"], tmp_path)
    _assert_clean(proc, "Unknown model 'smollm2-135m-instuct'", "Close matches: smollm2-135m-instruct")


def test_cli_subprocess_unwritable_out(tmp_path):
    (tmp_path / "file.txt").write_text("x")
    proc = _cli(["fit", "--model", "tiny-random", "--task", "antonym", "--out", "file.txt/sub",
                 *TINY_FIT], tmp_path)
    _assert_clean(proc, "file.txt is a file, not a directory")


def test_cli_in_process_non_finite_lr(tmp_path, capsys):
    rc = cli_main(["fit", "--model", "tiny-random", "--task", "antonym", "--out", str(tmp_path / "ad"),
                   "--lr", "inf", *TINY_FIT])
    err = capsys.readouterr().err
    assert rc == 2 and "argument --lr: must be a finite number > 0" in err and "Traceback" not in err


ZS = ["--methods", "zero-shot"]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "make_args, needles",
    [
        (lambda d: ["eval", "--model", "tiny-random", "--task", "antonymm", *ZS],
         ["Unknown task 'antonymm'", "Did you mean: antonym"]),
        (lambda d: ["eval", "--model", "tiny-random", "--task", str(_write(d / "t.json", "")), *ZS],
         ["is empty"]),
        (lambda d: ["eval", "--model", "tiny-random", "--task", str(_write(d / "t.json", "[{")), *ZS],
         ["not valid JSON"]),
        (lambda d: ["eval", "--model", "tiny-random",
                    "--task", str(_write(d / "t.json", '[{"input": "a"}]')), *ZS],
         ["'input' and 'output' keys"]),
        (lambda d: ["eval", "--model", "tiny-random",
                    "--task", str(_write(d / "t.json", '[{"input": 1, "output": [2]}]')), *ZS],
         ["non-string 'output'"]),
        (lambda d: ["eval", "--model", "tiny-random", "--task",
                    str(_write(d / "t.json", json.dumps([{"input": "a", "output": "b"}] * 4))), *ZS],
         ["duplicate item(s)", "--dedupe"]),
        (lambda d: ["eval", "--model", "tiny-random", "--task", "antonym", "--methods", "icl",
                    "--n-shots", "100", "--limit", "2"],
         ["needs at least 142 pairs for 100 shots"]),
        (lambda d: ["eval", "--model", "tiny-random", "--task", "antonym", "--methods", "icl",
                    "--n-shots", "40", "--limit", "2"],
         ["the model's context (n_ctx) is 256"]),
        (lambda d: ["eval", "--model", "tiny-random", "--task", "antonym", "--methods", "site"],
         ["Method 'site' needs --adapter DIR"]),
        (lambda d: ["eval", "--model", "tiny-random", "--task", "antonym", "--methods", "site",
                    "--adapter", str(d)],
         ["is not an adapter directory"]),
    ],
    ids=["unknown-task", "empty-task-file", "malformed-json", "missing-key", "non-string",
         "duplicates", "too-few-train-items", "prompt-too-long", "site-without-adapter",
         "not-an-adapter"],
)
def test_cli_in_process_errors(tmp_path, capsys, make_args, needles):
    rc = cli_main(make_args(tmp_path))
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("sitelens: error: "), err
    for n in needles:
        assert n in err, err


def test_cli_in_process_adapter_for_another_model(adapter, tmp_path, capsys):
    d = _saved(adapter, tmp_path)  # fitted on tiny_mha; tiny-random-gqa has other weights
    rc = cli_main(["eval", "--model", "tiny-random-gqa", "--task", "antonym", "--methods", "site",
                   "--adapter", str(d), "--limit", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "Adapter was fitted on" in err and "Load the matching model or refit" in err


def test_cli_in_process_corrupted_adapter(adapter, tmp_path, capsys):
    d = _saved(adapter, tmp_path)
    f = d / "adapter.safetensors"
    f.write_bytes(f.read_bytes()[:-7])
    rc = cli_main(["eval", "--model", "tiny-random", "--task", "antonym", "--methods", "site",
                   "--adapter", str(d)])
    err = capsys.readouterr().err
    assert rc == 2 and "does not match the checksum" in err
