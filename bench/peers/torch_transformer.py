#!/usr/bin/env python3
"""PyTorch reference of gorun's Transformer training step (GPU benchmark; CPU peer).

The model is gorun's transformer package (OpenSeq2Seq's transformer "base" by default), built by
hand so that it is the same computation:

- d_model 512, 8 heads, FFN 2048, 6 encoder + 6 decoder layers (transformer/config.go "base");
- pre-layer-norm blocks, x + dropout(sublayer(layer_norm(x))), a final layer norm on each stack,
  layer-norm epsilon 1e-6;
- attention: Q/K/V/output projections without biases, q * dh^-0.5, a key padding mask on encoder
  self-attention and encoder-decoder attention, a causal mask (and no padding mask) on decoder
  self-attention, dropout on the attention weights;
- FFN relu(x W1 + b1), dropout, W2 + b2 (biases here);
- dropout 0.1 (attention weights, relu output, sublayer outputs, embedded inputs);
- one [vocab, d] matrix E shared by the encoder input, the decoder input and the softmax
  projection (logits = h E^T, no bias); embeddings scaled by sqrt(d), zero for PAD (id 0);
  sinusoidal positions [sin(t*inv_i), cos(t*inv_i)] concatenated, inv_i = exp(-i*ln(1e4)/(d/2-1));
- decoder input = target shifted right by one with PAD (the zero vector) first;
- loss: label-smoothed cross entropy, the target id gets 0.9 and every other id 0.1/(V-1), mean
  over non-pad target tokens;
- Adam as TensorFlow's and gorun's (beta1 0.9, beta2 0.997, eps 1e-9 added to the uncorrected
  sqrt(v), the bias correction folded into the step size; see tf_adam_eps), dense (gorun's LazyAdam
  is dense Adam for this tied model, see make_adam); learning rate transformer_policy
  2.0 * d^-0.5 * min((step+1)^-0.5, (step+1) * warmup^-1.5), warmup 8000;
- 60,880,896 parameters for 32768 ids (asserted).

Modes (python3 bench/peers/torch_transformer.py ...):

  --self-check                 tiny sizes, seconds: semantic checks of the model and one pass of the
                               measurement code in every precision; exit status 1 on a failure
  --sweep [--json OUT]         the GPU grid: {amp-fp16, amp-bf16, fp32} x {4096, 12288, 25000}
                               batch tokens, eager; then amp-fp16 at 12288 with --attn math and
                               amp-fp16 at 12288 with --compile
  --precision P[,P] --batch-tokens N[,N] [--compile] [--attn sdpa|math] [--json OUT]
                               the given grid
  --dump-batches FILE          writes the batch shapes (lengths of every sentence) as JSON lines, so
                               that gorun can be fed the same shapes; needs no torch
  --config tiny|small|base     the earlier CPU peer (bench/peers/torch_transformer.sh): B x T
                               random ids, --threads, one RESULT line

Batch tokens: --batch-tokens N bounds B * max(S, T), the padded length of the longer side times
the rows, exactly as gorun's --batch-tokens (data.Batcher) and tensor2tensor count it. So N is
close to the padded target tokens per batch, and source + target is about 2N. Every output line
gives both counts, padded and non-pad.

Status: not yet run on a GPU, nor with torch 2.x (written on a machine with neither). Checked on
the CPU with Debian's torch 1.13: --self-check passes; on a tiny model with gorun's weights loaded,
loss and gradients equal gorun's (float32 rounding) and the Adam update with gorun's gradients equals
gorun's to 1 ulp; step_flops equals a dispatcher-level count of the matrix products. The torch 2.x
paths (scaled_dot_product_attention, torch.compile, autocast on CUDA, fused Adam, GradScaler, CUDA
events, FlopCounterMode) have only been read, not run.
"""
import argparse
import contextlib
import gc
import json
import math
import os
import platform
import random
import statistics
import sys
import time
import traceback

PAD, EOS, BOS, UNK = 0, 1, 2, 3

# name: (d_model, heads, ffn, encoder layers, decoder layers, dropout) as transformer/config.go.
PRESETS = {
    "tiny": (64, 4, 256, 2, 2, 0.1),
    "small": (256, 4, 1024, 3, 3, 0.1),
    "base": (512, 8, 2048, 6, 6, 0.1),
    "big": (1024, 16, 4096, 6, 6, 0.3),
}
LABEL_SMOOTHING = 0.1
LN_EPS = 1e-6
ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.997, 1e-9
GORUN_BASE_PARAMS = 60_880_896  # transformer.TestBaseParamCount: base, 32768 ids

# Sentence lengths (pieces, without EOS): source ~ lognormal(ln 24, 0.55), target = source *
# lognormal(0.05, 0.15) (German slightly longer), both at least 1, pairs whose longer side with
# EOS exceeds --max-len (56, the lab's) redrawn. An assumption shaped like WMT16 en-de with 32K
# BPE pieces (mean ~26 source pieces after the filter), not measured from the corpus.
SRC_MU, SRC_SIGMA = math.log(24.0), 0.55
RATIO_MU, RATIO_SIGMA = 0.05, 0.15

SWEEP_PRECISIONS = ("amp-fp16", "amp-bf16", "fp32")
SWEEP_BATCH_TOKENS = (4096, 12288, 25000)


def log(msg):
    print(msg, flush=True)


# --------------------------------------------------------------------------------------------
# Pure Python: parameter count, learning rate, FLOPs, batch shapes (no torch needed).

def param_count(preset, vocab):
    """Trainable scalars of gorun's model (transformer.New)."""
    d, _, f, le, ld, _ = PRESETS[preset]
    ffn = 2 * d * f + f + d
    enc = 4 * d * d + ffn + 2 * 2 * d
    dec = 8 * d * d + ffn + 3 * 2 * d
    return vocab * d + le * enc + 2 * d + ld * dec + 2 * d


def transformer_policy(step, lr=2.0, d_model=512, warmup=8000):
    """OpenSeq2Seq's transformer_policy at 0-based step (transformer/lr.go)."""
    s = float(step + 1)
    return lr * d_model ** -0.5 * min(s * warmup ** -1.5, s ** -0.5)


def step_flops(preset, vocab, B, S, T):
    """Matrix-product FLOPs of one training step on a padded B x S / B x T batch.

    The 6*N*D rule applied matrix by matrix: forward 2 FLOPs per multiply-add, backward twice the
    forward (the gradient with respect to the input and to the weight), so a step is 3 x forward,
    and every weight matrix is multiplied by the tokens that pass through it:
      encoder, per source token and layer:          Q,K,V,O 4d^2 + FFN 2*d*ffn
      decoder, per target token and layer:          self Q,K,V,O 4d^2 + cross Q,O 2d^2 + FFN 2*d*ffn
      decoder cross K,V, per source token and layer: 2d^2 (they read the encoder output)
      tied softmax projection, per target token:    V*d (the input lookups cost nothing)
    plus the attention term, Q K^T and P V: 2*Sq*Sk*d multiply-adds per sentence and attention
    layer, i.e. 12*d*Sq*Sk FLOPs per step (encoder S*S, decoder self T*T counted in full though
    causal, cross T*S). Padded shapes: the work done on the tensors as given. Biases, layer norms,
    softmax, dropout, the loss and Adam are not counted. For base with S ~ T this is within a few
    per cent of 6 * params * target tokens.
    """
    d, _, f, le, ld, _ = PRESETS[preset]
    ns, nt = B * S, B * T
    dense = ns * le * (4 * d * d + 2 * d * f) + nt * ld * (6 * d * d + 2 * d * f) \
        + ns * ld * 2 * d * d + nt * vocab * d
    attn = 2 * d * B * (le * S * S + ld * T * T + ld * T * S)
    return 6 * (dense + attn)


def bucket_bounds(budget, max_len):
    """data.Batcher's bucket upper bounds: 8, growing by 10%, the last one max_len."""
    if max_len <= 0:
        max_len = budget
    max_len = min(budget, max_len)
    bounds, n = [], 8
    while True:
        if n >= max_len:
            bounds.append(max_len)
            break
        bounds.append(n)
        n = max(n + 1, n * 11 // 10)
    return bounds


def draw_pair(rng, max_len):
    """Source and target length of one sentence pair, EOS included."""
    while True:
        ls = max(1, int(round(rng.lognormvariate(SRC_MU, SRC_SIGMA))))
        lt = max(1, int(round(ls * rng.lognormvariate(RATIO_MU, RATIO_SIGMA))))
        if max(ls, lt) + 1 <= max_len:
            return ls + 1, lt + 1


def plan_batches(budget, n, seed, max_len=56):
    """n batch shapes as gorun's data.Batcher cuts them (one fixed-seed stream per budget).

    Pairs are drawn one by one and put in the bucket of their longer side (with EOS); a bucket with
    bound L is emitted as a batch when it holds budget // L pairs, padded to its longest source and
    target, so B * max(S, T) <= budget. The first max(4n, 200) batches are shuffled (fixed seed)
    and the first n kept: the mix of shapes of an epoch. Returns dicts with B, S, T, src_lens,
    tgt_lens (EOS included).
    """
    if budget < 2:
        raise ValueError("a batch of %d tokens cannot hold a sentence and its EOS" % budget)
    rng = random.Random(seed * 1000003 + budget)
    bounds = bucket_bounds(budget, max_len)
    top = bounds[-1]
    rows = [max(1, budget // b) for b in bounds]
    lookup = [0] * (top + 1)
    k = 0
    for length in range(1, top + 1):
        while bounds[k] < length:
            k += 1
        lookup[length] = k
    buckets = [[] for _ in bounds]
    pool = []
    want = max(4 * n, 200)
    while len(pool) < want:
        ls, lt = draw_pair(rng, top)
        k = lookup[max(ls, lt)]
        buckets[k].append((ls, lt))
        if len(buckets[k]) == rows[k]:
            pool.append(buckets[k])
            buckets[k] = []
    rng.shuffle(pool)
    out = []
    for i, pairs in enumerate(pool[:n]):
        src = [p[0] for p in pairs]
        tgt = [p[1] for p in pairs]
        out.append({"budget": budget, "index": i, "B": len(pairs), "S": max(src), "T": max(tgt),
                    "src_lens": src, "tgt_lens": tgt})
    return out


def tf_adam_eps(t):
    """PyTorch's Adam adds eps to sqrt(v / (1 - b2^t)); TensorFlow's (gorun's) adds it to sqrt(v)
    and folds sqrt(1 - b2^t) into the step size. Using eps / sqrt(1 - b2^t) at step t (1-based)
    makes the PyTorch update exactly TensorFlow's."""
    return ADAM_EPS / math.sqrt(1.0 - ADAM_B2 ** t)


def smoothed_entropy(vocab, ls=LABEL_SMOOTHING):
    conf, low = 1.0 - ls, ls / (vocab - 1)
    return -(conf * math.log(conf) + (vocab - 1) * low * math.log(low + 1e-20))


# --------------------------------------------------------------------------------------------
# The model.

def define_model(torch):
    """Returns the Model class (defined here so that the module imports without torch)."""
    nn = torch.nn
    F = torch.nn.functional

    class Attention(nn.Module):
        def __init__(self, d, heads, p, sdpa):
            super().__init__()
            self.h, self.dh, self.p, self.sdpa = heads, d // heads, p, sdpa
            self.q = nn.Linear(d, d, bias=False)
            self.k = nn.Linear(d, d, bias=False)
            self.v = nn.Linear(d, d, bias=False)
            self.o = nn.Linear(d, d, bias=False)

        def forward(self, x, mem, key_mask, causal):
            # key_mask: bool [B, 1, 1, Sk], True where the key is a real token (or None).
            B, tq, d = x.shape
            tk = mem.shape[1]
            q = self.q(x).view(B, tq, self.h, self.dh).transpose(1, 2)
            k = self.k(mem).view(B, tk, self.h, self.dh).transpose(1, 2)
            v = self.v(mem).view(B, tk, self.h, self.dh).transpose(1, 2)
            p = self.p if self.training else 0.0
            if self.sdpa:
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=p, is_causal=causal)
            else:
                w = torch.matmul(q * self.dh ** -0.5, k.transpose(-1, -2))
                if key_mask is not None:
                    w = w.masked_fill(~key_mask, float("-inf"))
                if causal:
                    future = torch.ones(tq, tk, dtype=torch.bool, device=w.device).triu(1)
                    w = w.masked_fill(future, float("-inf"))
                w = F.dropout(torch.softmax(w, dim=-1), p, self.training)
                o = torch.matmul(w, v)
            return self.o(o.transpose(1, 2).reshape(B, tq, d))

    class FFN(nn.Module):
        def __init__(self, d, f, p):
            super().__init__()
            self.p = p
            self.w1 = nn.Linear(d, f)  # filter_layer (kernel + bias)
            self.w2 = nn.Linear(f, d)  # output_layer (kernel + bias)

        def forward(self, x):
            return self.w2(F.dropout(F.relu(self.w1(x)), self.p, self.training))

    class EncLayer(nn.Module):
        def __init__(self, d, h, f, p, sdpa):
            super().__init__()
            self.p = p
            self.ln_att = nn.LayerNorm(d, eps=LN_EPS)
            self.att = Attention(d, h, p, sdpa)
            self.ln_ffn = nn.LayerNorm(d, eps=LN_EPS)
            self.ffn = FFN(d, f, p)

        def forward(self, x, key_mask):
            y = self.ln_att(x)
            x = x + F.dropout(self.att(y, y, key_mask, False), self.p, self.training)
            return x + F.dropout(self.ffn(self.ln_ffn(x)), self.p, self.training)

    class DecLayer(nn.Module):
        def __init__(self, d, h, f, p, sdpa):
            super().__init__()
            self.p = p
            self.ln_self = nn.LayerNorm(d, eps=LN_EPS)
            self.self_att = Attention(d, h, p, sdpa)
            self.ln_cross = nn.LayerNorm(d, eps=LN_EPS)
            self.cross = Attention(d, h, p, sdpa)
            self.ln_ffn = nn.LayerNorm(d, eps=LN_EPS)
            self.ffn = FFN(d, f, p)

        def forward(self, x, mem, src_mask):
            y = self.ln_self(x)
            x = x + F.dropout(self.self_att(y, y, None, True), self.p, self.training)
            x = x + F.dropout(self.cross(self.ln_cross(x), mem, src_mask, False), self.p, self.training)
            return x + F.dropout(self.ffn(self.ln_ffn(x)), self.p, self.training)

    class Model(nn.Module):
        def __init__(self, preset, vocab, sdpa, max_len=1024):
            super().__init__()
            d, h, f, le, ld, p = PRESETS[preset]
            self.preset, self.vocab, self.d, self.p = preset, vocab, d, p
            self.scale = math.sqrt(d)
            # torch's label_smoothing=e gives the target 1-e+e/V and every other id e/V; gorun
            # gives 1-ls and ls/(V-1): equal for e = ls*V/(V-1).
            self.ls_torch = LABEL_SMOOTHING * vocab / (vocab - 1)
            # registration order = gorun's parameter order
            self.emb = nn.Parameter(torch.empty(vocab, d))
            self.enc = nn.ModuleList(EncLayer(d, h, f, p, sdpa) for _ in range(le))
            self.enc_ln = nn.LayerNorm(d, eps=LN_EPS)
            self.dec = nn.ModuleList(DecLayer(d, h, f, p, sdpa) for _ in range(ld))
            self.dec_ln = nn.LayerNorm(d, eps=LN_EPS)
            half = d // 2
            inc = math.log(1e4) / max(half - 1, 1)
            t = torch.arange(max(max_len, 256), dtype=torch.float64).unsqueeze(1)
            ang = t * torch.exp(-torch.arange(half, dtype=torch.float64) * inc)
            self.register_buffer("pe", torch.cat([torch.sin(ang), torch.cos(ang)], 1).float(), persistent=False)
            # transformer.New: embedding N(0, d^-0.5), matrices Glorot uniform, biases 0,
            # layer norms gamma 1 beta 0 (nn.LayerNorm's default).
            with torch.no_grad():
                self.emb.normal_(0.0, d ** -0.5)
                for m in self.modules():
                    if isinstance(m, nn.Linear):
                        nn.init.xavier_uniform_(m.weight)
                        if m.bias is not None:
                            m.bias.zero_()

        def embed(self, ids):
            # gorun's Embedding zeroes the vector of PAD; E's row 0 itself is an ordinary
            # (initialised, trained) row of the softmax projection.
            keep = (ids != PAD).unsqueeze(-1).to(self.emb.dtype)
            x = F.embedding(ids, self.emb) * keep * self.scale + self.pe[: ids.shape[1]]
            return F.dropout(x, self.p, self.training)

        def logits(self, src, din):
            src_mask = (src != PAD)[:, None, None, :]
            x = self.embed(src)
            for layer in self.enc:
                x = layer(x, src_mask)
            mem = self.enc_ln(x)
            y = self.embed(din)
            for layer in self.dec:
                y = layer(y, mem, src_mask)
            return torch.matmul(self.dec_ln(y), self.emb.t())  # tied softmax projection

        def forward(self, src, din, tgt):
            z = self.logits(src, din)
            return F.cross_entropy(z.reshape(-1, z.shape[-1]), tgt.reshape(-1), ignore_index=PAD,
                                   label_smoothing=self.ls_torch)

    return Model


class Batch:
    __slots__ = ("src", "din", "tgt", "B", "S", "T", "src_tokens", "tgt_tokens")


def to_batch(torch, plan, vocab, gen, device):
    """Random ids in [4, vocab) with the plan's lengths: each sentence ends with EOS, right-padded
    with PAD; the decoder input is the target shifted right with PAD first."""
    def side(lens):
        n = max(lens)
        lt = torch.tensor(lens, dtype=torch.long).unsqueeze(1)
        ids = torch.randint(4, vocab, (len(lens), n), generator=gen, dtype=torch.long)
        pos = torch.arange(n).unsqueeze(0)
        ids[pos == lt - 1] = EOS
        ids[pos >= lt] = PAD
        return ids
    b = Batch()
    src, tgt = side(plan["src_lens"]), side(plan["tgt_lens"])
    din = torch.cat([torch.zeros(tgt.shape[0], 1, dtype=torch.long), tgt[:, :-1]], 1)
    b.src, b.din, b.tgt = src.to(device), din.to(device), tgt.to(device)
    b.B, b.S, b.T = plan["B"], plan["S"], plan["T"]
    b.src_tokens, b.tgt_tokens = sum(plan["src_lens"]), sum(plan["tgt_lens"])
    return b


def make_adam(torch, params, device):
    """Dense Adam. gorun's LazyAdam (NewLazyAdam, as OpenSeq2Seq's) updates every row here: the
    embedding is tied to the softmax projection, whose dense gradient reaches every row each step
    (in TensorFlow it densifies the gather's IndexedSlices), so for this model LazyAdam equals
    dense Adam (transformer/optim.go). Fused kernel on CUDA where the torch has it."""
    params = list(params)
    kw = dict(lr=1e-4, betas=(ADAM_B1, ADAM_B2), eps=ADAM_EPS)
    if device.type == "cuda":
        try:
            return torch.optim.Adam(params, fused=True, **kw), "adam-fused"
        except (TypeError, RuntimeError):
            pass
    return torch.optim.Adam(params, **kw), "adam"


class Trainer:
    def __init__(self, torch, model, fn, precision, device, lr=2.0, lr_warmup=8000):
        self.torch, self.model, self.fn, self.device = torch, model, fn, device
        self.lr, self.lr_warmup = lr, lr_warmup
        self.opt, self.opt_name = make_adam(torch, model.parameters(), device)
        self.amp = {"amp-fp16": torch.float16, "amp-bf16": torch.bfloat16}.get(precision)
        self.scaler = None
        if precision == "amp-fp16":
            if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
                self.scaler = torch.amp.GradScaler(device.type)
            else:
                self.scaler = torch.cuda.amp.GradScaler()
        self.t = 0

    def autocast(self):
        if self.amp is None:
            return contextlib.nullcontext()
        return self.torch.autocast(device_type=self.device.type, dtype=self.amp)

    def set_hparams(self, lr=None):
        self.t += 1
        if lr is None:
            lr = transformer_policy(self.t - 1, self.lr, self.model.d, self.lr_warmup)
        for g in self.opt.param_groups:
            g["lr"] = lr
            g["eps"] = tf_adam_eps(self.t)

    def step(self, b, lr=None):
        """One training step: forward + loss, backward, Adam. Returns the loss (a tensor)."""
        self.set_hparams(lr)
        self.opt.zero_grad(set_to_none=True)
        with self.autocast():
            loss = self.fn(b.src, b.din, b.tgt)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            loss.backward()
            self.opt.step()
        return loss.detach()


# --------------------------------------------------------------------------------------------
# Measurement.

def sync(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def set_tf32(torch, on):
    """TF32 for float32 matrix products (off by default in PyTorch; on only for --precision tf32).
    Only the one legacy flag, and only when it changes: torch >= 2.9 refuses (even inside
    torch.compile) a mix of the legacy allow_tf32 flags and the new fp32_precision API, and the
    model has no convolution, so cuDNN's flag is left alone."""
    matmul = getattr(getattr(torch.backends, "cuda", None), "matmul", None)
    if matmul is not None and bool(matmul.allow_tf32) != on:
        matmul.allow_tf32 = on


_MATMUL = {}


def matmul_rate(torch, device, precision, n):
    """FLOP/s of an n x n x n matrix product in the precision's matmul dtype (fp16, bf16; fp32
    without TF32 for fp32, with TF32 for tf32), measured in this process: the dense rate MFU is
    taken against."""
    key = (precision, n)
    if key in _MATMUL:
        return _MATMUL[key]
    dt = {"amp-fp16": torch.float16, "amp-bf16": torch.bfloat16}.get(precision, torch.float32)
    g = torch.Generator(device=device).manual_seed(7) if device.type == "cuda" else torch.Generator().manual_seed(7)
    a = torch.randn(n, n, device=device, dtype=torch.float32, generator=g).to(dt)
    b = torch.randn(n, n, device=device, dtype=torch.float32, generator=g).to(dt)
    c = torch.empty(n, n, device=device, dtype=dt)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    sync(torch, device)
    iters = 10
    t0 = time.perf_counter()
    if device.type == "cuda":
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(iters):
            torch.matmul(a, b, out=c)
        e1.record()
        sync(torch, device)
        secs = e0.elapsed_time(e1) / 1e3
    else:
        for _ in range(iters):
            torch.matmul(a, b, out=c)
        secs = time.perf_counter() - t0
    del a, b, c
    rate = 2.0 * n ** 3 * iters / secs
    _MATMUL[key] = rate
    return rate


def dynamo_graphs(torch):
    """Graphs torch.compile has compiled in this process so far (best effort)."""
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:
        return None


def peak_rss_mib():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def env_info(torch, device):
    info = {"torch": torch.__version__, "python": platform.python_version()}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(device=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                    capability="%d.%d" % (p.major, p.minor), gpu_mem_gib=round(p.total_memory / 2 ** 30, 1),
                    cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
    else:
        info.update(device="cpu (%s, %d threads)" % (platform.processor() or platform.machine(), torch.get_num_threads()))
    return info


def measure(torch, device, a, preset, vocab, precision, budget, use_compile, attn, steps, warmup,
            matmul_n, tag=None):
    """Builds a fresh model and times `steps` training steps; returns the JSON record."""
    rec = {"impl": "torch", "preset": preset, "vocab": vocab, "precision": precision,
           "compile": bool(use_compile), "attn": attn, "batch_tokens": budget,
           "batch_tokens_counts": "B*max(S,T) <= batch_tokens (gorun's --batch-tokens)",
           "steps": steps, "warmup": warmup, "seed": a.seed}
    if tag:
        rec["tag"] = tag
    rec.update(env_info(torch, device))
    model = trainer = fn = None
    try:
        set_tf32(torch, precision == "tf32")
        rec["tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
        mm = matmul_rate(torch, device, precision, matmul_n)
        rec["matmul_n"] = matmul_n
        rec["matmul_tflops"] = round(mm / 1e12, 2)

        plans = plan_batches(budget, steps, a.seed, a.max_len)
        gen = torch.Generator().manual_seed(a.seed)
        batches = [to_batch(torch, p, vocab, gen, device) for p in plans]
        torch.manual_seed(a.seed)
        if device.type == "cuda":
            torch.cuda.manual_seed_all(a.seed)
            torch.cuda.reset_peak_memory_stats(device)
        Model = define_model(torch)
        model = Model(preset, vocab, attn == "sdpa", max_len=max(max(b.S, b.T) for b in batches)).to(device).train()
        n_params = sum(p.numel() for p in model.parameters())
        rec["params"] = n_params
        assert n_params == param_count(preset, vocab), (n_params, param_count(preset, vocab))
        if preset == "base" and vocab == 32768:
            assert n_params == GORUN_BASE_PARAMS, n_params
        fn = model
        if use_compile:
            # Batches come in many shapes (B, S, T): compile once with symbolic sizes rather than
            # once per shape, and without "duck shaping" (which would tie S to T when the first
            # batch has S == T and recompile at the first batch with S != T).
            try:
                import torch.fx.experimental._config as fx_config
                fx_config.use_duck_shape = False
            except (ImportError, AttributeError):
                pass
            fn = torch.compile(model, dynamic=True)
            rec["compile_args"] = "dynamic=True"
        trainer = Trainer(torch, model, fn, precision, device, a.lr, a.lr_warmup)
        rec["optimizer"] = trainer.opt_name

        # Warm-up: the first `warmup` batches; with --compile every timed batch once, so that any
        # (re)compilation for their shapes happens before the clock starts.
        warm = batches if use_compile else batches[:warmup]
        if use_compile and len(warm) < warmup:
            warm = (batches * warmup)[:warmup]
        sync(torch, device)
        t0 = time.perf_counter()
        for b in warm:
            trainer.step(b)
        sync(torch, device)
        rec["warmup_s"] = round(time.perf_counter() - t0, 2)
        graphs = dynamo_graphs(torch) if use_compile else None
        scale0 = trainer.scaler.get_scale() if trainer.scaler is not None else None

        losses, times = [], []
        if device.type == "cuda":
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in batches]
            sync(torch, device)
            t0 = time.perf_counter()
            for b, (e0, e1) in zip(batches, ev):
                e0.record()
                losses.append(trainer.step(b))
                e1.record()
            sync(torch, device)
            wall = time.perf_counter() - t0
            times = [e0.elapsed_time(e1) for e0, e1 in ev]
            rec["peak_mem_mib"] = round(torch.cuda.max_memory_allocated(device) / 2 ** 20)
            rec["peak_reserved_mib"] = round(torch.cuda.max_memory_reserved(device) / 2 ** 20)
        else:
            t0 = time.perf_counter()
            for b in batches:
                t1 = time.perf_counter()
                losses.append(trainer.step(b))
                times.append((time.perf_counter() - t1) * 1e3)
            wall = time.perf_counter() - t0
            rec["peak_rss_mib"] = round(peak_rss_mib())
        if graphs is not None:
            rec["dynamo_graphs_warmup"] = graphs
            after = dynamo_graphs(torch)
            if after is not None:
                rec["dynamo_graphs_timed"] = after - graphs  # should be 0: no compile while timed
        if scale0 is not None:
            scale1 = trainer.scaler.get_scale()
            # growth comes every 2000 steps only: a drop of the scale = skipped (overflowed) steps
            rec["fp16_skipped_steps"] = int(round(math.log2(scale0 / scale1))) if scale1 < scale0 else 0
        lv = [float(x) for x in losses]

        n = len(batches)
        src_t = sum(b.src_tokens for b in batches)
        tgt_t = sum(b.tgt_tokens for b in batches)
        src_p = sum(b.B * b.S for b in batches)
        tgt_p = sum(b.B * b.T for b in batches)
        flops = sum(step_flops(preset, vocab, b.B, b.S, b.T) for b in batches)
        rec.update({
            "B_mean": round(sum(b.B for b in batches) / n, 1),
            "S_mean": round(sum(b.S for b in batches) / n, 1),
            "T_mean": round(sum(b.T for b in batches) / n, 1),
            "tokens_src_tgt_per_step": round((src_t + tgt_t) / n),
            "tokens_tgt_per_step": round(tgt_t / n),
            "padded_src_tgt_per_step": round((src_p + tgt_p) / n),
            "padded_tgt_per_step": round(tgt_p / n),
            "step_ms_median": round(statistics.median(times), 3),
            "step_ms_mean": round(sum(times) / n, 3),
            "step_ms_min": round(min(times), 3),
            "step_ms_max": round(max(times), 3),
            "wall_ms_per_step": round(wall * 1e3 / n, 3),
            "tok_s_src_tgt": round((src_t + tgt_t) / wall),
            "tok_s_tgt": round(tgt_t / wall),
            "model_flops_per_step": flops // n,
            "approx_6PT_flops_per_step": 6 * n_params * tgt_p // n,
            "achieved_tflops": round(flops / wall / 1e12, 2),
            "mfu": round(flops / wall / mm, 4),
            "loss_first": round(lv[0], 4),
            "loss_last": round(lv[-1], 4),
            "loss_finite": all(math.isfinite(x) for x in lv),
        })
    except Exception as e:  # report and go on with the next configuration
        msg = str(e).strip()
        rec["error"] = "%s: %s" % (type(e).__name__, msg.splitlines()[0][:400] if msg else "")
        tb = traceback.extract_tb(e.__traceback__)
        ours = [f for f in tb if os.path.basename(f.filename) == os.path.basename(__file__)]
        for key, f in (("error_at", ours[-1] if ours else None), ("error_deepest", tb[-1] if tb else None)):
            if f is not None:
                rec[key] = "%s:%d %s" % (os.path.basename(f.filename), f.lineno, f.name)
    finally:
        del model, trainer, fn
        gc.collect()
        if use_compile and hasattr(torch, "_dynamo"):
            try:
                torch._dynamo.reset()
            except Exception:
                pass
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rec


def summary(rec):
    if "error" in rec:
        return "# %s %s bt=%s compile=%s attn=%s: ERROR %s" % (
            rec["preset"], rec["precision"], rec["batch_tokens"], rec["compile"], rec["attn"], rec["error"])
    return ("# %s %s bt=%d compile=%s attn=%s: step %.1f ms median (%.1f mean), %s tgt tok/s, %s src+tgt tok/s, "
            "peak %s MiB, %.2f TFLOP/s model, MFU %.1f%% of %.2f TFLOP/s matmul, loss %.3f->%.3f" % (
                rec["preset"], rec["precision"], rec["batch_tokens"], rec["compile"], rec["attn"],
                rec["step_ms_median"], rec["step_ms_mean"], format(rec["tok_s_tgt"], ","),
                format(rec["tok_s_src_tgt"], ","), rec.get("peak_mem_mib", rec.get("peak_rss_mib")),
                rec["achieved_tflops"], 100 * rec["mfu"], rec["matmul_tflops"], rec["loss_first"], rec["loss_last"]))


def emit(rec, json_path):
    log(summary(rec))
    line = json.dumps(rec, sort_keys=True)
    print(line, flush=True)
    if json_path:
        with open(json_path, "a") as f:
            f.write(line + "\n")


# --------------------------------------------------------------------------------------------
# Self-check: tiny sizes, seconds.

def self_check(torch, device, a):
    F = torch.nn.functional
    Model = define_model(torch)
    failures = []
    have_sdpa = hasattr(F, "scaled_dot_product_attention")

    def check(name, ok, detail=""):
        log("%s %s %s" % ("ok  " if ok else "FAIL", name, detail))
        if not ok:
            failures.append(name)

    # 1. the formulas
    check("param_count(base, 32768) == 60,880,896", param_count("base", 32768) == GORUN_BASE_PARAMS,
          str(param_count("base", 32768)))
    lrs = [transformer_policy(s) for s in (7999, 61700, 300000)]
    check("transformer_policy matches gorun's lr.go test values",
          all(abs(x - y) / y < 2e-3 for x, y in zip(lrs, (9.882e-4, 3.558e-4, 1.614e-4))), str(lrs))
    check("smoothed entropy V=32768 = 1.3648 nats", abs(smoothed_entropy(32768) - 1.3648) < 1e-4,
          "%.5f" % smoothed_entropy(32768))
    plans = plan_batches(4096, 50, a.seed, a.max_len)
    check("batches respect B*max(S,T) <= 4096", all(p["B"] * max(p["S"], p["T"]) <= 4096 for p in plans),
          "mean B %.0f, S %.1f, T %.1f" % (statistics.mean(p["B"] for p in plans),
                                           statistics.mean(p["S"] for p in plans), statistics.mean(p["T"] for p in plans)))

    # 2. the base model's parameter count, built
    torch.manual_seed(a.seed)
    m = Model("base", 32768, have_sdpa).to(device)
    n = sum(p.numel() for p in m.parameters())
    check("built base model has 60,880,896 parameters", n == GORUN_BASE_PARAMS, format(n, ","))
    del m
    gc.collect()

    # 3. tiny model semantics (fp32, eval mode: no dropout)
    set_tf32(torch, False)
    V = 97
    torch.manual_seed(a.seed)
    tiny = Model("tiny", V, False).to(device).double().eval()
    gen = torch.Generator().manual_seed(a.seed)
    plan = {"B": 3, "S": 7, "T": 6, "src_lens": [7, 4, 2], "tgt_lens": [5, 6, 1]}
    b = to_batch(torch, plan, V, gen, device)
    with torch.no_grad():
        loss = tiny(b.src, b.din, b.tgt).item()
        z = tiny.logits(b.src, b.din).reshape(-1, V)
        lp = torch.log_softmax(z, -1)
        y = b.tgt.reshape(-1)
        keep = y != PAD
        lpy = lp.gather(1, y.unsqueeze(1)).squeeze(1)
        ref = -(0.9 * lpy + (0.1 / (V - 1)) * (lp.sum(1) - lpy))
        ref = (ref[keep].sum() / keep.sum()).item()
        check("loss = gorun's label smoothing (0.9 / 0.1/(V-1)), mean over non-pad targets",
              abs(loss - ref) < 1e-9 * max(1.0, abs(ref)), "%.10f vs %.10f" % (loss, ref))
        e = tiny.embed(torch.zeros(2, 5, dtype=torch.long, device=device))
        check("PAD embeds to the zero vector (+ positions)", torch.equal(e, tiny.pe[:5].double().expand(2, 5, -1)))
        check("positions: row 1 = [sin(inv_i), cos(inv_i)], inv_0 = 1, inv_last = 1e-4",
              abs(tiny.pe[1, 0].item() - math.sin(1.0)) < 1e-6 and abs(tiny.pe[1, 31].item() - math.sin(1e-4)) < 1e-9
              and abs(tiny.pe[1, 32].item() - math.cos(1.0)) < 1e-6)
        # padding invariance: more PAD columns on the source change nothing
        src2 = torch.cat([b.src, torch.zeros(3, 4, dtype=torch.long, device=device)], 1)
        z2 = tiny.logits(src2, b.din).reshape(-1, V)
        check("source padding is masked (extra PAD columns change no logit)",
              torch.allclose(z, z2, rtol=0, atol=1e-10), "max diff %.2e" % (z - z2).abs().max().item())
        # causality: changing target position 3 changes no logit at positions <= 3
        tgt3 = b.tgt.clone()
        tgt3[:, 3] = 5 + (tgt3[:, 3] % 50)
        din3 = torch.cat([torch.zeros(3, 1, dtype=torch.long, device=device), tgt3[:, :-1]], 1)
        z3 = tiny.logits(b.src, din3).reshape(3, 6, V)
        zz = z.reshape(3, 6, V)
        check("decoder is causal (target t only reaches logits after t)",
              torch.allclose(zz[:, :4], z3[:, :4], rtol=0, atol=1e-10) and not torch.allclose(zz[:, 4:], z3[:, 4:]))
        if have_sdpa:
            s = Model("tiny", V, True).to(device).double().eval()
            s.load_state_dict(tiny.state_dict())
            zs = s.logits(b.src, b.din).reshape(-1, V)
            check("sdpa attention = math attention", torch.allclose(z, zs, rtol=1e-9, atol=1e-9),
                  "max diff %.2e" % (z - zs).abs().max().item())
            del s
        else:
            log("skip sdpa attention = math attention (torch %s has no scaled_dot_product_attention)" % torch.__version__)

    # 4. FLOP formula against torch's counter (math attention, fp32)
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        FlopCounterMode = None
    if FlopCounterMode is not None:
        fm = Model("tiny", V, False).to(device).train()
        with FlopCounterMode(display=False) as fc:
            fm(b.src, b.din, b.tgt).backward()
        got, want = fc.get_total_flops(), step_flops("tiny", V, b.B, b.S, b.T)
        # a warning, not a failure: the FLOP count only scales the MFU column
        log("%s step_flops = torch's FlopCounterMode (fwd+bwd matmuls) %d vs %d" % (
            "ok  " if got == want else "WARN", got, want))
        del fm
    else:
        log("skip step_flops vs FlopCounterMode (torch %s has none)" % torch.__version__)

    # 5. Adam with the eps correction = TensorFlow's update (float64 reference)
    w0 = torch.randn(64, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    p = torch.nn.Parameter(w0.clone().float().to(device))
    opt, _ = make_adam(torch, [p], device)
    mm = torch.zeros(64, dtype=torch.float64)
    vv = torch.zeros(64, dtype=torch.float64)
    ref = p.detach().double().cpu().clone()
    worst = 0.0
    for t in range(1, 4):
        # tiny gradients at steps 1 and 3 make sqrt(v) comparable to eps, where its placement shows
        g = torch.randn(64, generator=torch.Generator().manual_seed(10 + t), dtype=torch.float64) * (1e-2 if t == 2 else 1e-8)
        for grp in opt.param_groups:
            grp["lr"] = 1e-3
            grp["eps"] = tf_adam_eps(t)
        p.grad = g.float().to(device)
        opt.step()
        mm = ADAM_B1 * mm + (1 - ADAM_B1) * g
        vv = ADAM_B2 * vv + (1 - ADAM_B2) * g * g
        ref = ref - 1e-3 * math.sqrt(1 - ADAM_B2 ** t) / (1 - ADAM_B1 ** t) * mm / (vv.sqrt() + ADAM_EPS)
        worst = max(worst, (p.detach().double().cpu() - ref).abs().max().item())
    check("Adam(eps/sqrt(1-b2^t)) = TensorFlow's Adam", worst < 1e-6, "max diff %.2e" % worst)

    # 6. a tiny model learns a fixed batch (dropout on), fp32, the Trainer's code path
    torch.manual_seed(a.seed)
    tm = Model("tiny", V, have_sdpa).to(device).train()
    tr = Trainer(torch, tm, tm, "fp32", device)
    l0 = tr.step(b, lr=3e-3).item()
    for _ in range(40):
        l1 = tr.step(b, lr=3e-3).item()
    check("tiny model overfits one batch in 40 steps", l1 < 0.6 * l0, "loss %.3f -> %.3f" % (l0, l1))
    del tm, tr

    # 7. the measurement code path in every precision, tiny sizes
    precs = ["fp32"] + (["amp-fp16", "amp-bf16", "tf32"] if device.type == "cuda" else [])
    attn = "sdpa" if have_sdpa else "math"
    for prec in precs:
        rec = measure(torch, device, a, "tiny", 1000, prec, 1024, False, attn, 3, 2,
                      1024 if device.type == "cuda" else 256, tag="self-check")
        log(summary(rec))
        check("measure tiny %s" % prec, "error" not in rec and rec.get("loss_finite", False), rec.get("error", ""))
    if device.type == "cuda":
        rec = measure(torch, device, a, "base", 32768, "amp-bf16", 4096, False, attn, 2, 1, 1024, tag="self-check")
        log(summary(rec))
        check("measure base amp-bf16 4096", "error" not in rec and rec.get("loss_finite", False), rec.get("error", ""))
    if a.compile:
        t0 = time.perf_counter()
        rec = measure(torch, device, a, "tiny", 1000, precs[-1] if device.type != "cuda" else "amp-fp16",
                      1024, True, attn, 3, 2, 256, tag="self-check")
        log(summary(rec))
        check("measure tiny with torch.compile (%.0f s)" % (time.perf_counter() - t0),
              "error" not in rec and rec.get("loss_finite", False), rec.get("error", ""))
    log("self-check: %s" % ("all passed" if not failures else "FAILED: " + "; ".join(failures)))
    return not failures


# --------------------------------------------------------------------------------------------
# The earlier CPU peer (bench/peers/torch_transformer.sh).

LEGACY_VOCAB = {"tiny": 8000, "small": 8000, "base": 32000}


def legacy_cpu(torch, a):
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    preset, V = a.config, LEGACY_VOCAB[a.config]
    d, h, f, L, _, _ = PRESETS[preset]
    B, T = a.batch, a.seq
    device = torch.device("cpu")
    Model = define_model(torch)
    m = Model(preset, V, False, max_len=T).train()
    opt, _ = make_adam(torch, m.parameters(), device)
    src = torch.randint(4, V, (B, T))
    tgt = torch.randint(4, V, (B, T))
    din = torch.cat([torch.zeros(B, 1, dtype=torch.long), tgt[:, :-1]], 1)
    nparams = sum(p.numel() for p in m.parameters())
    warmup = 2 if a.warmup is None else a.warmup
    steps = 5 if a.steps is None else a.steps
    fw, bw, st, tot, losses = [], [], [], [], []
    for i in range(warmup + steps):
        for g in opt.param_groups:
            g["lr"], g["eps"] = 1e-4, tf_adam_eps(i + 1)
        t0 = time.perf_counter()
        loss = m(src, din, tgt)
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        losses.append(loss.item())
        if i >= warmup:
            fw.append(t1 - t0)
            bw.append(t2 - t1)
            st.append(t3 - t2)
            tot.append(t3 - t0)
    med = statistics.median
    print(f"# torch {torch.__version__} threads={torch.get_num_threads()} {preset}: d={d} h={h} L={L}+{L} ffn={f} "
          f"vocab={V} B={B} T={T} params={nparams} loss {losses[0]:.3f}->{losses[-1]:.3f}")
    print("RESULT impl=torch config=%s threads=%d fwd_s=%.4f bwd_s=%.4f adam_s=%.4f step_s=%.4f tgt_tok_s=%.0f params=%d peak_rss_mib=%.0f"
          % (preset, a.threads, med(fw), med(bw), med(st), med(tot), B * T / med(tot), nparams, peak_rss_mib()))


# --------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--self-check", action="store_true", help="tiny-size checks (seconds); exit 1 on failure")
    ap.add_argument("--sweep", action="store_true", help="the GPU grid (see the module docstring)")
    ap.add_argument("--precision", default="amp-fp16", help="fp32|tf32|amp-fp16|amp-bf16, comma-separated")
    ap.add_argument("--batch-tokens", default="12288", help="bound on B*max(S,T), comma-separated")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (failures are reported)")
    ap.add_argument("--attn", choices=("sdpa", "math"), default=None,
                    help="sdpa: F.scaled_dot_product_attention (default where available); math: softmax(QK^T)V written out")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (20; CPU peer 5)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps (5; CPU peer 2)")
    ap.add_argument("--json", default=None, help="append one JSON line per configuration to this file")
    ap.add_argument("--preset", default="base", choices=PRESETS)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--max-len", type=int, default=56, help="longest side with EOS (the lab's 56)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lr", type=float, default=2.0, help="transformer_policy learning rate")
    ap.add_argument("--lr-warmup", type=int, default=8000, help="transformer_policy warm-up steps")
    ap.add_argument("--matmul-n", type=int, default=8192, help="size of the timed matmul for MFU")
    ap.add_argument("--device", default="auto", help="auto (cuda if available), cuda, cpu")
    ap.add_argument("--dump-batches", default=None, metavar="FILE",
                    help="write the batch shapes of --batch-tokens (and --steps) as JSON lines; no torch needed")
    ap.add_argument("--config", default=None, choices=("tiny", "small", "base"), help="the earlier CPU peer")
    ap.add_argument("--threads", type=int, default=2, help="CPU peer: torch threads")
    ap.add_argument("--batch", type=int, default=32, help="CPU peer: sentences")
    ap.add_argument("--seq", type=int, default=32, help="CPU peer: tokens per side")
    a = ap.parse_args()

    steps = 20 if a.steps is None else a.steps
    warmup = 5 if a.warmup is None else a.warmup
    budgets = [int(x) for x in a.batch_tokens.split(",") if x]
    if a.dump_batches:
        with open(a.dump_batches, "w") as f:
            for bt in budgets:
                for p in plan_batches(bt, steps, a.seed, a.max_len):
                    f.write(json.dumps(p) + "\n")
        log("wrote %d batch shapes to %s" % (steps * len(budgets), a.dump_batches))
        return 0

    import torch

    if a.config:
        legacy_cpu(torch, a)
        return 0

    if a.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(a.device)
    attn = a.attn or ("sdpa" if hasattr(torch.nn.functional, "scaled_dot_product_attention") else "math")
    info = env_info(torch, device)
    log("# %s" % " ".join("%s=%s" % kv for kv in sorted(info.items())))

    if a.self_check:
        return 0 if self_check(torch, device, a) else 1

    if a.sweep:
        if device.type != "cuda":
            log("--sweep is the GPU grid (Transformer-base at up to 25000 tokens): no GPU here; "
                "try --self-check, or --preset tiny with --precision/--batch-tokens")
            return 2
        grid = [(p, bt, False, attn) for p in SWEEP_PRECISIONS for bt in SWEEP_BATCH_TOKENS]
        grid.append(("amp-fp16", 12288, False, "math"))
        grid.append(("amp-fp16", 12288, True, attn))
    else:
        grid = [(p, bt, a.compile, attn) for p in a.precision.split(",") if p for bt in budgets]
    for p, _, _, _ in grid:
        if p not in ("fp32", "tf32", "amp-fp16", "amp-bf16"):
            ap.error("unknown precision %r" % p)
    t0 = time.perf_counter()
    for p, bt, comp, at in grid:
        rec = measure(torch, device, a, a.preset, a.vocab, p, bt, comp, at, steps, warmup, a.matmul_n)
        emit(rec, a.json)
    log("# %d configurations in %.0f s" % (len(grid), time.perf_counter() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
