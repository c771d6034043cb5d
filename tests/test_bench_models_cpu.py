"""The models benchmark's command line, layer grouping and tables, without a GPU or torchvision."""
import json
import os
import subprocess
import sys
import types

import pytest

from cupyconv import bench, bench_models

torch = pytest.importorskip("torch")
nn = torch.nn


def models_args(*argv):
    return bench.parse_args(["--suite", "models", *argv])


def test_defaults():
    args = models_args("--dtype", "all")
    assert args.models == list(bench_models.MODELS) and args.batches == [1, 8, 32, 128]
    assert args.timings == ["eager", "graph"] and not args.per_layer
    assert args.layouts == {"fp32": ["nchw"], "tf32": ["nchw"], "fp16": ["nchw", "channels_last"],
                            "bf16": ["nchw", "channels_last"]}
    assert bench_models.output_stem(args) == "models_all_fp32-tf32-fp16-bf16"
    layers = models_args("--per-layer")
    assert layers.batches == [1, 32] and layers.timings == [] and layers.modes == ["fp32"]
    assert bench_models.output_stem(layers) == "model_layers_all_fp32"


def test_selections():
    args = models_args("--model", "vgg16", "--model", "resnet18", "--batch", "32", "--batch", "1",
                       "--dtype", "fp16", "--layout", "channels_last", "--timing", "graph", "--quick")
    assert args.models == ["vgg16", "resnet18"] and args.batches == [32, 1] and args.timings == ["graph"]
    assert args.layouts == {"fp16": ["channels_last"]}
    assert bench_models.output_stem(args) == "models_vgg16-resnet18_fp16_b32-1_channels_last_graph_quick"


def test_compile_runs_on_resnet50_unless_models_are_named():
    args = models_args("--timing", "eager", "--timing", "compile")
    assert bench_models.timings_for(args, "resnet50") == ["eager", "compile"]
    assert bench_models.timings_for(args, "vgg16") == ["eager"]
    assert models_args("--timing", "compile").models == ["resnet50"]  # no model built for nothing
    named = models_args("--timing", "compile", "--model", "mobilenet_v2")
    assert named.models == ["mobilenet_v2"] and bench_models.timings_for(named, "mobilenet_v2") == ["compile"]


def test_fuse_and_the_autotuned_timing():
    args = models_args("--fuse", "--timing", "graph", "--timing", "autotuned", "--dtype", "fp16")
    assert args.fuse and bench_models.timings_for(args, "resnet50") == ["graph", "autotuned"]
    assert bench_models.timings_for(args, "vgg16") == ["graph"]  # autotuned is compile's cost: resnet50 unless named
    assert bench_models.output_stem(args) == "models_all_fp16_graph-autotuned_fused"
    text = bench_models.to_markdown({"meta": {**META, "per_layer": False},
                                     "rows": [model_row(timing="autotuned", fused=53, torch_compile_s=200.0,
                                                        cupyconv_compile_s=1.5)]})
    assert "| autotuned | fused (53 of 53 convs) | 4.000 | 2.000 | 2.00x |" in text and "200.0 / 1.5" in text


def test_static_weights():
    args = models_args("--static-weights", "--timing", "graph", "--dtype", "tf32", "--model", "resnet50")
    assert args.static_weights
    assert bench_models.output_stem(args) == "models_resnet50_tf32_graph_static"
    text = bench_models.to_markdown({"meta": {**META, "per_layer": False},
                                     "rows": [model_row(timing="graph", static_weights=True)]})
    assert "| graph | converted, static weights | 4.000 | 2.000 | 2.00x |" in text
    for refused in (["--per-layer"], ["--timing", "train"]):
        with pytest.raises(SystemExit):
            models_args("--static-weights", *refused)


def test_the_train_timing_runs_on_resnet50_at_batch_32_unless_others_are_named():
    args = models_args("--timing", "train", "--dtype", "fp32", "--dtype", "fp16")
    assert args.models == ["resnet50"] and args.batches == [32] and args.timings == ["train"]
    assert args.layouts == {"fp32": ["nchw"], "fp16": ["nchw", "channels_last"]}
    assert bench_models.timings_for(args, "resnet50", 32) == ["train"]
    assert bench_models.output_stem(args) == "models_resnet50_fp32-fp16_b32_train"
    mixed = models_args("--timing", "eager", "--timing", "train")
    assert mixed.batches == [1, 8, 32, 128] and mixed.models == list(bench_models.MODELS)
    assert bench_models.timings_for(mixed, "resnet50", 32) == ["eager", "train"]
    assert bench_models.timings_for(mixed, "resnet50", 8) == ["eager"]
    assert bench_models.timings_for(mixed, "vgg16", 32) == ["eager"]
    named = models_args("--timing", "train", "--model", "vgg16", "--batch", "8", "--dtype", "fp16",
                        "--layout", "channels_last")
    assert named.models == ["vgg16"] and named.batches == [8] and bench_models.timings_for(named, "vgg16", 8) == ["train"]
    assert bench_models.output_stem(named) == "models_vgg16_fp16_b8_channels_last_train"


@pytest.mark.parametrize("argv", [["--batch", "0"], ["--per-layer", "--timing", "eager"], ["--model", "alexnet"],
                                  ["--timing", "jit"], ["--layout", "nhwc"], ["--timing", "autotuned"],
                                  ["--per-layer", "--fuse"], ["--timing", "train", "--fuse"],
                                  ["--per-layer", "--timing", "train"]])
def test_bad_options(argv):
    with pytest.raises(SystemExit):
        models_args(*argv)


def small_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.Conv2d(8, 8, 3, padding=1, bias=False),
                         nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.Conv2d(8, 8, 3, padding=1, bias=False),
                         nn.Conv2d(8, 16, 1, stride=2, dilation=1)).eval()


def test_layers_are_recorded_and_identical_ones_grouped():
    model = small_net()
    x = torch.randn(2, 3, 10, 10)
    with torch.inference_mode():
        calls = bench_models.record_convs(model, x)
    assert [c.name for c in calls] == ["0", "2", "3", "4", "5", "6"]
    assert all(not m._forward_pre_hooks for m in model.modules()), "hooks removed"
    first = calls[0]
    assert first.x is x and first.module is model[0]
    assert first.config == bench_models.ConvConfig((2, 3, 10, 10), (8, 3, 3, 3), True, (1, 1), (1, 1), (1, 1), 1,
                                                   "float32", False)
    groups = bench_models.group_convs(calls)
    assert [(call.name, names) for call, names in groups] == [("0", ["0"]), ("2", ["2", "3", "5"]), ("4", ["4"]),
                                                              ("6", ["6"])]
    assert [call.config.label() for call, _ in groups] == [
        "3->8 10x10 k3x3 s1 p1 +bias", "8->8 10x10 k3x3 s1 p1", "8->8 10x10 k3x3 s1 p1 g8 +bias",
        "8->16 10x10 k1x1 s2 p0 +bias"]


def test_channels_last_and_string_padding_are_part_of_the_config():
    model = nn.Sequential(nn.Conv2d(4, 4, (3, 5), padding="same", dilation=(1, 2))).to(memory_format=torch.channels_last)
    with torch.inference_mode():
        (call,) = bench_models.record_convs(model, torch.randn(2, 4, 9, 9).contiguous(memory_format=torch.channels_last))
    assert call.config.channels_last and call.config.padding == "same"
    assert call.config.label() == "4->4 9x9 k3x5 s1 psame d1x2 +bias"


def test_hooks_are_removed_when_the_forward_raises():
    model = nn.Sequential(nn.Conv2d(3, 4, 3))
    with pytest.raises(RuntimeError):
        bench_models.record_convs(model, torch.randn(1, 5, 8, 8))
    assert not model[0]._forward_pre_hooks


def test_batch_norm_is_scaled_to_unit_mean_square_layer_by_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8)).eval()
    with torch.no_grad():
        model[0].weight.mul_(1e-3)  # a drifting scale, as random initialisation gives
    images = torch.randn(4, 3, 12, 12)
    bench_models.calibrate_batch_norm(model, images)
    assert all(not m._forward_pre_hooks for m in model.modules()), "hooks removed"
    with torch.no_grad():
        assert float(model[:2](images).pow(2).mean()) == pytest.approx(1, rel=1e-3)
        assert float(model(images).pow(2).mean()) == pytest.approx(1, rel=1e-3)  # scaled after the first
    assert not model[1].running_mean.any() and not model.training  # features not centred, still eval


def test_a_check_against_a_torch_result_without_signal_is_skipped():
    assert bench_models._status(1e-3, 1e-3, 5e-2) is None
    assert bench_models._status(1e-1, 1e-3, 5e-2).startswith("WRONG")
    assert bench_models._status(1.0, 1.0, 2.0).startswith("SKIP (torch's own error is 1")
    assert bench_models._status(float("nan"), float("nan"), 5e-2).startswith("SKIP")


META = {"gpu": "H100", "torch": "2", "cudnn": 9, "cupy": "14", "layout": "nchw, channels_last",
        "cudnn_benchmark": False, "date": "today", "commit": "abc1234", "dirty": False}


def model_row(model="resnet50", timing="eager", layout="nchw", speedup=2.0, **fields):
    row = {"model": model, "mode": "fp16", "layout": layout, "batch": 32, "timing": timing, "convs": 53,
           "status": "ok", "error": 1e-3, "torch_error": 2e-3, "torch_ms": 2.0 * speedup, "cupyconv_ms": 2.0,
           "speedup": speedup, "seconds": 3.0}
    return {**row, **fields}


def table(text):
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert len({line.count("|") for line in lines}) == 1, "every markdown row has as many cells as the header"
    return lines


def test_models_markdown():
    rows = [model_row(speedup=2.0), model_row(speedup=0.5, model="vgg16"),
            model_row(speedup=8.0, layout="channels_last"),  # not in the NCHW geomean
            model_row(timing="graph", speedup=1.25),
            model_row(timing="compile", speedup=1.0, torch_compile_s=41.2, cupyconv_compile_s=55.7),
            {"model": "resnet50", "mode": "fp16", "layout": "nchw", "batch": 32, "timing": "graph", "convs": 53,
             "status": "WRONG (error 1.00e+00 > 5.0e-02)", "error": 1.0, "torch_error": 2e-3, "seconds": 3.0},
            {"model": "resnet50", "mode": "fp16", "layout": "nchw", "batch": 128, "timing": "graph", "convs": 53,
             "status": "SKIP (out of GPU memory: CUDA out of memory)", "seconds": 3.0}]
    text = bench_models.to_markdown({"meta": {**META, "per_layer": False}, "rows": rows})
    assert "commit: abc1234" in text
    lines = table(text)
    assert len(lines) == 2 + len(rows)
    assert "| resnet50 | fp16 | nchw | 32 | eager | converted | 4.000 | 2.000 | 2.00x | 1.0e-03 | 2.0e-03 |  |" in text
    assert "| compile | converted | 2.000 | 2.000 | 1.00x | 1.0e-03 | 2.0e-03 | 41.2 / 55.7 |" in text
    assert "WRONG (error 1.00e+00 > 5.0e-02) | 1.0e+00 |" in text and "| SKIP (out of GPU memory" in text
    assert "geomean speed-up, eager, NCHW rows: 1.00x over 2 rows" in text  # sqrt(2 x 0.5)
    assert "geomean speed-up, graph, NCHW rows: 1.25x over 1 rows" in text
    assert "geomean speed-up, compile, NCHW rows: 1.00x over 1 rows" in text


def layer_row(layer, count, torch_ms, cupyconv_ms, torch_wall_us, cupyconv_wall_us, batch=32, status="ok"):
    return {"model": "resnet50", "mode": "fp32", "layout": "nchw", "batch": batch, "layer": layer, "count": count,
            "names": [f"l{i}" for i in range(count)], "status": status, "torch_ms": torch_ms,
            "cupyconv_ms": cupyconv_ms, "speedup": torch_ms / cupyconv_ms, "torch_wall_us": torch_wall_us,
            "cupyconv_wall_us": cupyconv_wall_us, "wall_speedup": torch_wall_us / cupyconv_wall_us}


def test_per_layer_markdown_marks_losses_and_sums_by_count():
    rows = [layer_row("64->64 56x56 k3x3 s1 p1", 3, 0.1, 0.05, 30, 300),
            layer_row("3->64 224x224 k7x7 s2 p3", 1, 0.2, 0.4, 250, 500),
            layer_row("256->64 56x56 k1x1 s1 p0", 2, 0.1, 0.1, 20, 20, status="WRONG (error 1.00e+00 > 1.0e-05)"),
            layer_row("64->64 56x56 k3x3 s1 p1", 3, 0.01, 0.02, 30, 20, batch=1)]
    text = bench_models.to_markdown({"meta": {**META, "per_layer": True}, "rows": rows})
    lines = table(text)
    assert len(lines) == 2 + len(rows) + 2  # a sum line per (model, mode, layout, batch)
    assert "| 64->64 56x56 k3x3 s1 p1 | 3 | 0.100 | 0.050 | 2.00x | 30 | 300 | 0.10x | wall |" in text
    assert "| 3->64 224x224 k7x7 s2 p3 | 1 | 0.200 | 0.400 | 0.50x | 250 | 500 | 0.50x | GPU, wall |" in text
    assert "| 256->64 56x56 k1x1 s1 p0 | 2 |  |  | WRONG (error 1.00e+00 > 1.0e-05) |" in text
    # 3 x 0.1 + 0.2 = 0.5 ms against 3 x 0.05 + 0.4 = 0.55; wall 3 x 30 + 250 = 340 against 3 x 300 + 500
    assert "| resnet50 | fp32 | nchw | 32 | sum of 2 timed layers | 4 | 0.500 | 0.550 | 0.91x | 340 | 1400 | 0.24x |  |" in text
    assert "| resnet50 | fp32 | nchw | 1 | 64->64 56x56 k3x3 s1 p1 | 3 | 0.010 | 0.020 | 0.50x | 30 | 20 | 1.50x | GPU |" in text
    # Per image over the one layer timed at both batches: N1 3 x 0.02 / 1 against N32 3 x 0.05 / 32.
    assert ("resnet50 fp32 nchw: GPU ms per image over 1 layers, cupyconv / torch: N1 0.0600 / 0.0300 (12.80x N32's), "
            "N32 0.0047 / 0.0094 (1.00x N32's)") in text


def train_row(speedup=0.8, backward_speedup=0.9, **fields):
    row = model_row(timing="train", speedup=speedup, torch_ms=40.0, cupyconv_ms=40.0 / speedup,
                    torch_backward_ms=40.0 / backward_speedup, torch_backward_speedup=backward_speedup,
                    error=3e-7, torch_error=6e-5, torch_backward_error=6e-5)
    return {**row, **fields}


def test_train_rows_in_the_models_markdown():
    rows = [train_row(), model_row(),
            train_row(layout="channels_last", status="WRONG (error 1.00e+00 > 1.0e-02) in conv1's weight gradient, "
                                                       "cupyconv side")]
    text = bench_models.to_markdown({"meta": {**META, "per_layer": False}, "rows": rows})
    lines = table(text)
    assert len(lines) == 2 + len(rows) and lines[0].endswith("| with torch's backward: ms (speed-up) |")
    assert "| resnet50 | fp16 | nchw | 32 | train | converted | 40.000 | 50.000 | 0.80x | 3.0e-07 | 6.0e-05 |  | 44.444 (0.90x) |" in text
    assert "| eager | converted | 4.000 | 2.000 | 2.00x | 1.0e-03 | 2.0e-03 |  |  |" in text  # no backward for a forward
    assert "| train | converted |  |  | WRONG (error 1.00e+00 > 1.0e-02) in conv1's weight gradient, cupyconv side |" in text
    assert "geomean speed-up, train, NCHW rows: 0.80x over 1 rows" in text
    line = bench_models._model_line({**train_row(), "seconds": 1.0})
    assert "train" in line and "with torch's backward   44.444 ms   0.90x" in line and "gradient  error 3.0e-07" in line


def classifier(inplace=True):
    """A tiny torchvision-like classifier: a stem, batch norm, an in-place ReLU straight after a convolution (as
    VGG's), a depthwise and a strided convolution, pooling and a linear layer of 10 classes."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=inplace),
                         nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(inplace=inplace),
                         nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(16, 10)).eval()


def test_checked_convolutions_are_the_first_middle_and_last():
    assert bench_models.checked_convs(classifier()) == ["0", "5", "8"]
    assert bench_models.checked_convs(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3))) == ["0", "2"]
    assert bench_models.checked_convs(nn.Sequential(nn.Conv2d(3, 4, 3))) == ["0"]
    assert bench_models.checked_convs(nn.Sequential(nn.Linear(3, 4))) == []


def test_a_step_records_what_each_checked_gradient_is_computed_from():
    model = classifier().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, target = torch.randn(4, 3, 8, 8), torch.tensor([0, 3, 9, 3])
    before = {name: model.get_submodule(name).weight.detach().clone() for name in ("0", "3", "8")}
    with bench_models.recorded_gradients(model, ["0", "3", "8"]) as records:
        loss = bench_models.training_step(model, optimizer, x, target)
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules()), "hooks removed"
    assert loss.dim() == 0 and not loss.requires_grad and torch.isfinite(loss)
    assert "dx" not in records["0"] and records["0"]["x"] is not x and torch.equal(records["0"]["x"], x)
    for name, record in records.items():
        module = model.get_submodule(name)
        assert torch.equal(record["weight"], before[name]) and not torch.equal(module.weight, before[name]), \
            "the weight as the gradient saw it, before the SGD step changed it"
        args = (module.stride, module.padding, module.dilation, module.groups)
        # The output's gradient as the convolution saw it (not the in-place ReLU's after conv 3): its weight
        # gradient is the module's.
        wgrad = torch.nn.grad.conv2d_weight(record["x"], module.weight.shape, record["dy"], *args)
        torch.testing.assert_close(module.weight.grad, wgrad)
        if name != "0":
            torch.testing.assert_close(record["dx"], torch.nn.grad.conv2d_input(record["x"].shape, record["weight"],
                                                                                record["dy"], *args))
    checks = bench_models.gradient_checks(model, records)
    assert [(c["layer"], c["gradient"]) for c in checks] == [("0", "weight"), ("3", "weight"), ("3", "input"),
                                                               ("8", "weight"), ("8", "input")]
    assert all(c["error"] < 1e-5 and c["error"] == c["torch_error"] for c in checks)  # torch's own on the CPU
    # The same step without recording: the same loss (the copies change nothing).
    again = classifier().train()
    assert bench_models.training_step(again, torch.optim.SGD(again.parameters(), lr=0.1, momentum=0.9), x, target) == loss


def test_gradient_checks_and_losses_decide_a_train_rows_status():
    check = {"layer": "conv1", "gradient": "weight", "error": 2e-5, "torch_error": 6e-5}
    assert bench_models._check_status("fp32", check) is None  # within twice torch's own, above the 1e-5 floor
    assert bench_models._check_status("fp32", {**check, "torch_error": 1e-7}).startswith("WRONG")
    assert bench_models._check_status("fp16", {**check, "error": 9e-3, "torch_error": 1e-3}) is None
    assert bench_models._check_status("fp16", {**check, "error": float("nan")}).startswith("WRONG")
    assert bench_models._loss_status({"torch": 6.9, "cupyconv": 6.9}, "on the first step") is None
    assert bench_models._loss_status({"torch": 6.9, "cupyconv": float("nan")}, "after 54 steps") == \
        "WRONG (loss not finite after 54 steps: cupyconv nan)"
    assert bench_models._loss_status({"torch": float("inf"), "cupyconv": float("nan")}, "x").startswith("SKIP")
    assert bench_models._worst([1e-3, float("nan"), 2e-3]) != bench_models._worst([1e-3, float("nan"), 2e-3])  # NaN
    assert bench_models._worst([1e-3, 2e-3]) == 2e-3 and bench_models._worst([]) == 0.0


def test_a_train_row_runs_end_to_end_on_the_cpu(tmp_path, monkeypatch):
    # The suite needs a GPU; here the row runs on the CPU (cupyconv.torch's convolutions fall back to torch's
    # there), with bench's CUDA-only wall-time helper and metadata replaced.
    import cupyconv.torch as ct

    timed = {}

    def loop_ms(fns, calls, loops=5, warmup=3):
        timed.update(calls=calls, loops=loops, warmup=warmup)
        for _ in range(warmup + loops * calls):
            for fn in fns.values():
                fn()
        return {"torch": 40.0, "cupyconv": 50.0, "torch_backward": 44.0}

    steps, real_step = [], bench_models.training_step

    def step(model, *args):  # whether the model is converted, and whose backward is on, at each step
        steps.append((any(isinstance(m, ct.Conv2d) for m in model.modules()), ct._BACKWARD))
        return real_step(model, *args)

    monkeypatch.setattr(bench_models, "training_step", step)
    monkeypatch.setattr(bench, "alternating_loop_ms", loop_ms)
    monkeypatch.setattr(bench, "_meta", lambda args: dict(META))
    monkeypatch.setattr(bench_models, "IMAGE", (3, 32, 32))
    args = models_args("--timing", "train", "--model", "resnet50", "--batch", "3", "--quick", "--out", str(tmp_path))
    run = bench_models._Run(args, torch, types.SimpleNamespace(__version__="test"))
    run.device = "cpu"
    model = classifier()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    previous = ct.set_backward("cupyconv")
    try:
        run.model_rows("resnet50", "fp32", "nchw", model)
        assert ct._BACKWARD == "cupyconv", "set_backward restored"
    finally:
        ct.set_backward(previous)
    (row,) = run.results["rows"]
    assert row["status"] == "ok" and row["timing"] == "train" and row["batch"] == 3 and row["convs"] == 4
    assert row["speedup"] == 0.8 and row["torch_backward_speedup"] == pytest.approx(40 / 44)
    assert row["checked"] == ["0", "5", "8"] and set(row["checks"]) == {"cupyconv", "torch_backward"}
    assert len(row["checks"]["cupyconv"]) == 5
    assert 0 < row["error"] == row["torch_error"] == row["torch_backward_error"] < 1e-4  # torch's own on the CPU
    assert set(row["loss"]) == set(row["final_loss"]) == {"torch", "cupyconv", "torch_backward"}
    assert row["loss"]["cupyconv"] == row["loss"]["torch"]  # the same weights and batch
    assert row["final_loss"]["torch"] < row["loss"]["torch"], "the steps train"
    assert row["steps"] == 1 + timed["warmup"] + timed["calls"] * timed["loops"]
    assert (timed["calls"], timed["loops"]) == (bench_models.QUICK_CALLS, bench_models.QUICK_LOOPS)
    # torch's model, and the converted one with cupyconv's backward and with torch's, each every step.
    assert len(steps) == 3 * row["steps"]
    assert {side: steps.count(side) for side in set(steps)} == {(False, "cupyconv"): row["steps"],
                                                                (True, "cupyconv"): row["steps"],
                                                                (True, "torch"): row["steps"]}
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items()), "the model given is left as it was"
    assert not model.training
    stem = tmp_path / "models_resnet50_fp32_b3_train_quick"
    assert json.loads(stem.with_suffix(".json").read_text())["rows"][0]["checks"] == row["checks"]
    assert "| resnet50 | fp32 | nchw | 3 | train | converted | 40.000 | 50.000 | 0.80x |" in stem.with_suffix(".md").read_text()


def test_importing_the_models_benchmark_imports_no_torch():
    code = "import sys, cupyconv.bench_models; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_torchvision_or_a_gpu_it_says_so_and_fails_cleanly(tmp_path):
    # No GPU visible, also on a machine that has one: the test must never start a benchmark.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-m", "cupyconv.bench", "--suite", "models", "--model", "resnet18",
                             "--quick", "--out", str(tmp_path)], capture_output=True, text=True, env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    try:
        import torchvision  # noqa: F401
    except ImportError:
        assert "needs torchvision" in result.stderr
    else:
        assert "needs a CUDA GPU" in result.stderr
    assert not list(tmp_path.iterdir())
