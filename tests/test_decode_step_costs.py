"""What a decode step computes once: RoPE's cos/sin once per forward (not per layer), RMSNorm
through torch's fused op with the textbook formula's values, and the compiled decode step
static in the cache length (one graph per cache length, none symbolic in it)."""

import torch
import torch.nn.functional as F

from multihead import CausalLM, LMConfig
from multihead.modules.norm import RMSNorm
from multihead.positional.rope import RotaryEmbedding, apply_rope


def _model(num_layers: int = 3) -> CausalLM:
    torch.manual_seed(0)
    cfg = LMConfig(
        vocab_size=53,
        dim=32,
        num_layers=num_layers,
        num_heads=4,
        num_kv_heads=2,
        position="rope",
        norm="rmsnorm",
        mlp="swiglu",
        bias=False,
    )
    return CausalLM(cfg).eval()


def test_rope_tables_are_made_once_per_forward_and_rotate_as_the_formula(monkeypatch):
    m = _model()
    calls = []
    made = RotaryEmbedding._cos_sin

    def counting(self, positions, dtype):
        calls.append(positions)
        return made(self, positions, dtype)

    ids = torch.randint(0, 53, (2, 7))
    with torch.no_grad():
        expected = m(ids)
        monkeypatch.setattr(RotaryEmbedding, "_cos_sin", counting)
        got = m(ids)
        assert len(calls) == 1  # three layers, one table
        caches = m.make_caches(2, max_length=12)
        m(ids, caches=caches)
        m(ids[:, :1], caches=caches)
    assert len(calls) == 3  # one per forward, not kept across forwards
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # the rotation against the rotate-half formula (Su et al. / GPT-NeoX layout), per row too
    rope = RotaryEmbedding(16, base=500.0)
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    for positions in (torch.arange(3, 8), torch.tensor([[0, 1, 2, 3, 4], [9, 10, 11, 12, 13]])):
        angles = positions.double()[..., None] * rope.inv_freq.double()
        cos = torch.cat([angles, angles], -1).cos().float()
        sin = torch.cat([angles, angles], -1).sin().float()
        rq, rk = rope.rotate(q, k, positions)
        torch.testing.assert_close(rq, apply_rope(q, cos, sin), rtol=0, atol=1e-5)
        torch.testing.assert_close(rk, apply_rope(k, cos, sin), rtol=0, atol=1e-5)


def test_rope_tables_are_shared_within_a_thread_only(monkeypatch):
    """The shared tables live in the caller's context: a second thread that runs the same
    rotary module while the first is inside its forward computes its own (and leaves nothing
    behind once both are done)."""
    import threading

    rope = RotaryEmbedding(16, base=500.0)
    made = RotaryEmbedding._cos_sin
    calls: list[str] = []

    def counting(self, positions, dtype):
        calls.append(threading.current_thread().name)
        return made(self, positions, dtype)

    monkeypatch.setattr(RotaryEmbedding, "_cos_sin", counting)
    q, k = torch.randn(1, 4, 5, 16), torch.randn(1, 2, 5, 16)
    positions = torch.arange(5)

    def other() -> None:
        rope.rotate(q, k, positions)
        rope.rotate(q, k, positions)

    with rope.shared_cos_sin():
        rope.rotate(q, k, positions)
        t = threading.Thread(target=other, name="other")
        t.start()
        t.join()
        rope.rotate(q, k, positions)
    assert calls.count("other") == 2  # outside any block in its own context: no sharing
    assert calls.count(threading.current_thread().name) == 1
    rope.rotate(q, k, positions)  # after the block: computed again
    assert len(calls) == 4


def test_rmsnorm_fused_path_has_the_formulas_values():
    torch.manual_seed(1)
    for weight in (True, False):
        norm = RMSNorm(48, eps=1e-5, elementwise_affine=weight)
        if weight:
            with torch.no_grad():
                norm.weight.normal_()
        x = torch.randn(3, 5, 48) * 4
        ref = (x.double() / (x.double().pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()).float()
        if weight:
            ref = ref * norm.weight
        torch.testing.assert_close(norm(x), ref, rtol=1e-6, atol=1e-6)
    # bfloat16 and Gemma's offset keep the float32 formula and the cast back
    norm = RMSNorm(48, eps=1e-6, offset=1.0)
    x = torch.randn(2, 48)
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(norm(x), h * (norm.weight + 1.0), rtol=0, atol=0)


def test_rmsnorm_fast_path_is_f_rms_norm_bit_for_bit_and_follows_eps():
    # the count and eps are kept as tensors on the module: a changed eps must be read
    torch.manual_seed(2)
    for width in (48, 576):
        norm = RMSNorm(width, eps=1e-5)
        with torch.no_grad():
            norm.weight.normal_()
        x = torch.randn(2, 3, width) * 3
        assert torch.equal(norm(x), F.rms_norm(x, (width,), norm.weight, 1e-5))
        norm.eps = 0.5
        assert torch.equal(norm(x), F.rms_norm(x, (width,), norm.weight, 0.5))
        assert not torch.equal(norm(x), F.rms_norm(x, (width,), norm.weight, 1e-5))
    # kept constants first made under inference_mode serve a later call with a gradient
    norm = RMSNorm(48)
    with torch.inference_mode():
        norm(torch.randn(2, 48))
    x = torch.randn(2, 48, requires_grad=True)
    norm(x).sum().backward()
    assert x.grad is not None


def test_compiled_decode_step_is_static_in_the_cache_length():
    m = _model(num_layers=1)
    graphs: list[bool] = []  # per compiled graph: does any input have a symbolic size?

    def recording(gm, example_inputs):
        symbolic = any(
            isinstance(d, torch.SymInt)
            for t in example_inputs
            if isinstance(t, torch.Tensor)
            for d in t.shape
        ) or any(isinstance(t, torch.SymInt) for t in example_inputs)
        graphs.append(symbolic)
        return gm.forward

    torch._dynamo.reset()
    ids = torch.randint(0, 53, (1, 5))
    with torch.no_grad():
        short = m.generate(ids, 3, compile={"backend": recording})  # cache 64
        long = m.generate(ids, 70, compile={"backend": recording})  # cache 128
        assert torch.equal(short, m.generate(ids, 3))
        assert torch.equal(long, m.generate(ids, 70))
    torch._dynamo.reset()
    # per cache length a prefill (dynamic in the prompt length) and a static step (with
    # dynamo's automatic dynamic shapes the second step was symbolic: slower per token)
    assert graphs == [True, False, True, False]


def test_compiled_generation_at_many_lengths_never_hits_the_recompile_limit():
    """Each (batch, cache length) compiles a static step; under fullgraph dynamo fails hard
    past 8 recompilations of one code object, so the steps must not share one: nine lengths
    and a second batch size in one process all generate, equal to eager."""
    m = _model(num_layers=1)
    compiled: list[int] = []

    def recording(gm, example_inputs):
        compiled.append(1)
        return gm.forward

    torch._dynamo.reset()
    torch.manual_seed(2)
    with torch.no_grad():
        for i, batch in [(i, 1) for i in range(9)] + [(0, 2), (1, 2)]:
            ids = torch.randint(0, 53, (batch, 5 + 64 * i))  # cache 64 (i + 1)
            new = 3
            got = m.generate(ids, new, compile={"backend": recording})
            assert torch.equal(got, m.generate(ids, new)), (i, batch)
    torch._dynamo.reset()
    assert len(compiled) >= 11  # (a step per shape, and the prefill)


def test_compiled_decode_step_skips_module_guards():
    """The step is compiled without dynamo's guards on the model's modules (thousands per
    token on a real model); the prefill keeps them. A given mode leaves torch.compile's
    options alone (it takes one or the other)."""
    from multihead.modules import generation as gen

    cpu = torch.device("cpu")
    step = gen._compile_args(True, cpu, step=True)
    if not hasattr(torch.compiler, "skip_guard_on_all_nn_modules_unsafe"):  # torch < 2.7
        assert gen.STEP_GUARDS is None and "guard_filter_fn" not in step["options"]
        return
    assert step["options"]["guard_filter_fn"] is torch.compiler.skip_guard_on_all_nn_modules_unsafe
    assert step["options"]["cpp.min_chunk_size"] == gen.ATEN_GRAIN_SIZE
    assert "guard_filter_fn" not in gen._compile_args(True, cpu, step=False).get("options", {})
    assert "options" not in gen._compile_args({"mode": "max-autotune"}, cpu, step=True)
    mine = gen._compile_args({"options": {"max_autotune": True}}, cpu, step=True)["options"]
    assert mine == {"guard_filter_fn": gen.STEP_GUARDS, "max_autotune": True}


def _recorder(graphs: list[int]):
    def recording(gm, example_inputs):
        graphs.append(len(example_inputs))
        return gm.forward

    return recording


def test_compiled_steps_without_module_guards_follow_each_model():
    """With no guards on the modules, what keeps a compiled step to the model it was made for
    is its code object, one per model and structure (`model_key`; the step reads the
    parameters of the model it is given). Every change that alters what the step computes
    gets a step of its own: each output equals eager. (The changes of model `b` fail with a
    key that leaves out the structure.)"""
    from multihead.modules.step_key import model_key

    def models():
        a = _model(num_layers=1)
        torch.manual_seed(5)
        b = _model(num_layers=1)  # same shapes, other weights
        with torch.no_grad():
            for p in b.parameters():
                p.normal_()
        return a, b

    a, b = models()
    assert model_key(a) == model_key(b) and model_key(a) == model_key(a)
    graphs: list[int] = []
    compile = {"backend": _recorder(graphs)}
    torch._dynamo.reset()
    ids = torch.randint(0, 53, (1, 5))
    with torch.no_grad():

        def check(m, what):
            got = m.generate(ids, 4, compile=compile)
            assert torch.equal(got, m.generate(ids, 4)), what

        check(a, "first model")
        check(b, "second model, same structure")
        # untied head (the tied model's step takes one tensor for both)
        b.head.weight = torch.nn.Parameter(torch.randn_like(b.head.weight))
        check(b, "untied head")
        # a weight in another memory layout, another dtype, a module of another type
        up = b.layers[0].ffn.up
        up.weight = torch.nn.Parameter(up.weight.detach().t().contiguous().t())
        check(b, "column-major weight")
        b.norm_f = torch.nn.Identity()
        check(b, "module replaced")
        check(b.double(), "float64")
        # a forward hook registered on a module: traced into a new step
        handle = a.layers[0].ffn.register_forward_hook(lambda mod, args, out: out * 3)
        check(a, "forward hook")
        handle.remove()
        check(a, "hook removed")
        a.process_weights_()
        check(a, "process_weights_")
    torch._dynamo.reset()


def test_greedy_choice_is_argmax_with_ties_and_nan():
    """Greedy sampling reads max(-1)'s indices (faster on CPU than argmax): the same tokens
    as argmax, ties (first index) and NaN (taken as the largest) included."""
    from multihead.modules.sampling import sample

    g = torch.Generator().manual_seed(0)
    for i in range(200):
        x = torch.randint(-3, 4, (3, 1 + 37 * i), generator=g).float()  # many ties
        if i % 3 == 0:
            x[torch.rand(x.shape, generator=g) < 0.02] = float("nan")
        for dtype in (torch.float32, torch.bfloat16):
            y = x.to(dtype)
            assert torch.equal(sample(y, 0.0, None, None), y.argmax(-1))
