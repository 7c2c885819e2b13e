#!/usr/bin/python3
"""PyTorch CPU peer of gorun's transformer training step (bench/transformer_test.go).

Builds the same architecture as gorun's transformer package (OpenSeq2Seq's transformer):
pre-layer-norm residual blocks, a final layer norm in encoder and decoder, Q/K/V/O projections
without bias, FFN with biases and ReLU, one embedding matrix shared by encoder input, decoder input
and the softmax projection, embeddings scaled by sqrt(d_model), sinusoidal positions, dropout
(attention/relu/post-process) 0.1, label smoothing 0.1, Adam(0.9, 0.997, 1e-9).
Random token ids, B sentences x T tokens per side. Times forward+loss, backward, optimizer step;
warm-up, then median over steps. Prints one RESULT line.
"""
import argparse, math, os, statistics, time

CONFIGS = {  # name: (d_model, heads, layers (enc = dec), ffn, vocab)
    "tiny": (64, 4, 2, 256, 8000),
    "small": (256, 4, 3, 1024, 8000),
    "base": (512, 8, 6, 2048, 32000),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="small", choices=CONFIGS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    d, h, L, ffn, V = CONFIGS[a.config]
    B, T = a.batch, a.seq
    p_drop = 0.1

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))

        def forward(self, x, mem, mask):
            b, tq, _ = x.shape
            tk = mem.shape[1]
            q = self.q(x).view(b, tq, h, d // h).transpose(1, 2) * (d // h) ** -0.5
            k = self.k(mem).view(b, tk, h, d // h).transpose(1, 2)
            v = self.v(mem).view(b, tk, h, d // h).transpose(1, 2)
            w = F.dropout(torch.softmax(q @ k.transpose(-1, -2) + mask, -1), p_drop, self.training)
            return self.o((w @ v).transpose(1, 2).reshape(b, tq, d))

    class FFN(nn.Module):
        def __init__(self):
            super().__init__()
            self.f, self.g = nn.Linear(d, ffn), nn.Linear(ffn, d)

        def forward(self, x):
            return self.g(F.dropout(F.relu(self.f(x)), p_drop, self.training))

    class Enc(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.att, self.n2, self.ffn = nn.LayerNorm(d, eps=1e-6), Attn(), nn.LayerNorm(d, eps=1e-6), FFN()

        def forward(self, x, mask):
            y = self.n1(x)
            x = x + F.dropout(self.att(y, y, mask), p_drop, self.training)
            return x + F.dropout(self.ffn(self.n2(x)), p_drop, self.training)

    class Dec(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.att = nn.LayerNorm(d, eps=1e-6), Attn()
            self.n2, self.cross = nn.LayerNorm(d, eps=1e-6), Attn()
            self.n3, self.ffn = nn.LayerNorm(d, eps=1e-6), FFN()

        def forward(self, x, mem, smask, cmask):
            y = self.n1(x)
            x = x + F.dropout(self.att(y, y, smask), p_drop, self.training)
            x = x + F.dropout(self.cross(self.n2(x), mem, cmask), p_drop, self.training)
            return x + F.dropout(self.ffn(self.n3(x)), p_drop, self.training)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, d, padding_idx=0)
            nn.init.normal_(self.emb.weight, 0, d ** -0.5)
            self.enc = nn.ModuleList(Enc() for _ in range(L))
            self.dec = nn.ModuleList(Dec() for _ in range(L))
            self.enorm, self.dnorm = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)
            half = d // 2
            inv = torch.exp(-torch.arange(half) * math.log(1e4) / (half - 1))
            ang = torch.arange(max(T, 1) + 1).unsqueeze(1) * inv
            self.register_buffer("pe", torch.cat([torch.sin(ang), torch.cos(ang)], 1))
            self.register_buffer("causal", torch.triu(torch.full((T, T), -1e9), 1))

        def embed(self, ids):
            x = self.emb(ids) * d ** 0.5 + self.pe[: ids.shape[1]]
            return F.dropout(x, p_drop, self.training)

        def forward(self, src, din):
            pad = (src == 0).float()[:, None, None, :] * -1e9
            x = self.embed(src)
            for l in self.enc:
                x = l(x, pad)
            mem = self.enorm(x)
            y = self.embed(din)
            for l in self.dec:
                y = l(y, mem, self.causal, pad)
            return self.dnorm(y) @ self.emb.weight.t()  # tied softmax projection

    m = Model().train()
    opt = torch.optim.Adam(m.parameters(), lr=1e-4, betas=(0.9, 0.997), eps=1e-9)
    src = torch.randint(4, V, (B, T))
    tgt = torch.randint(4, V, (B, T))
    din = torch.cat([torch.zeros(B, 1, dtype=torch.long), tgt[:, :-1]], 1)
    nparams = sum(p.numel() for p in m.parameters())
    fw, bw, st, tot, losses = [], [], [], [], []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        logits = m(src, din)
        loss = F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1), ignore_index=0, label_smoothing=0.1)
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        losses.append(loss.item())
        if i >= a.warmup:
            fw.append(t1 - t0); bw.append(t2 - t1); st.append(t3 - t2); tot.append(t3 - t0)
    med = statistics.median
    rss = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                rss = int(line.split()[1]) / 1024
    print(f"# torch {torch.__version__} threads={torch.get_num_threads()} {a.config}: d={d} h={h} L={L}+{L} ffn={ffn} "
          f"vocab={V} B={B} T={T} params={nparams} loss {losses[0]:.3f}->{losses[-1]:.3f}")
    print("RESULT impl=torch config=%s threads=%d fwd_s=%.4f bwd_s=%.4f adam_s=%.4f step_s=%.4f tgt_tok_s=%.0f params=%d peak_rss_mib=%.0f"
          % (a.config, a.threads, med(fw), med(bw), med(st), med(tot), B * T / med(tot), nparams, rss))


if __name__ == "__main__":
    main()
