#!/usr/bin/env python3
"""Hand-made mutation testing of the packages where a silent bug costs most.

    python3 test/mutate/mutate.py [COMMIT]      # default HEAD

For each mutation below, in a scratch git worktree of COMMIT: change one
line of product code (the original must occur exactly once), run the tests
named, and count the mutation killed when they fail. Prints one line per
mutation and the share killed. Not in `make test` (a few minutes on 2 cores);
docs/architecture.md, "Mutation testing", has the last results.
"""
import os
import subprocess
import sys
import tempfile

# (name, file, original, mutant, packages, -run pattern)
MUTATIONS = [
    # the server requests a client certificate and checks it itself in
    # VerifyConnection (rank/auth.go's serverTLS and checkPeer)
    ("server accepts any client certificate", "rank/auth.go",
     "if err := a.checkPeer(cs.PeerCertificates); err != nil {", "if err := a.checkPeer(cs.PeerCertificates); err != nil && false {",
     ["./rank/"], ""),
    ("server accepts any client certificate chain", "rank/auth.go",
     "_, err := leaf.Verify(opts)", "var err error // chain not verified",
     ["./rank/"], ""),
    ("server accepts a client without a certificate", "rank/auth.go",
     'return &authError{by: a.name(), reason: noCertificate, msg: "it presented no certificate"}', "return nil",
     ["./rank/"], "Refuse|Stranger|MissingRank"),
    ("rendezvous ignores the certificate's rank", "rank/rendezvous.go",
     "if got := labelRank(peerLabel(conn.ConnectionState().TLS)); got != reg.Rank {",
     "if got := labelRank(peerLabel(conn.ConnectionState().TLS)); got < -1 {",
     ["./rank/"], "Refuse|Stranger|MissingRank"),
    ("shm segment of mode 0644 mapped", "rank/shm.go",
     "if st.Uid != uint32(os.Getuid()) || st.Mode&0o077 != 0 || st.Size != int64(size) {",
     "if st.Uid != uint32(os.Getuid()) || st.Size != int64(size) {",
     ["./rank/"], "Shm"),
    ("client does not verify the server", "rank/auth.go",
     "RootCAs:      a.pool,", "InsecureSkipVerify: true,",
     ["./rank/"], ""),
    ("Min reduces with max", "collective/reduce.go",
     "dst[i] = min(a[i], b[i])", "dst[i] = max(a[i], b[i])",
     ["./collective/"], ""),
    ("Average not divided on 2 ranks", "collective/reduce.go",
     "if r.op != Average || r.n == 1 {", "if r.op != Average || r.n <= 2 {",
     ["./collective/"], ""),
    ("fp16 wire sends bfloat16", "collective/reduce.go",
     "half.Float32ToFloat16(Uint16s(dst), src)", "half.Float32ToBFloat16(Uint16s(dst), src)",
     ["./collective/"], ""),
    ("direct allreduce of 16-bit data accumulates in 16 bits", "collective/direct.go",
     "\t\tapply(acc, acc, y, cl.op)\n",
     "\t\tapply(acc, acc, y, cl.op)\n\t\tif cl.dtype != Float32 {\n\t\t\tencode(contrib(me), acc, cl.dtype)\n\t\t\tdecode(acc, contrib(me), cl.dtype)\n\t\t}\n",
     ["./collective/"], "TestRandomFloats|TestAllreduce|TestLoopback"),
    ("shm allreduce rounds float32 partials to the wire", "collective/shared.go",
     "\t\t\t\tred.combine(mine, wpart(i, me))\n",
     "\t\t\t\tred.combine(mine, wpart(i, me))\n\t\t\t\tif conv {\n\t\t\t\t\tred.toWire(wpart(me, me), mine)\n\t\t\t\t\tred.fromWire(mine, wpart(me, me))\n\t\t\t\t}\n",
     ["./collective/"], "TestRandomFloats|TestShared"),
    ("Adam without bias correction", "transformer/optim.go",
     "lrT := lr * math.Sqrt(1-math.Pow(o.Beta2, t)) / (1 - math.Pow(o.Beta1, t))",
     "lrT := lr * math.Sqrt(1-math.Pow(o.Beta2, t))",
     ["./transformer/"], ""),
    ("Adam's beta2 is beta1", "transformer/optim.go",
     "Beta2: float32(o.Beta2)", "Beta2: float32(o.Beta1)",
     ["./transformer/"], ""),
    ("checkpoint checksums not compared", "checkpoint/checkpoint.go",
     "if got != want {", "if false && got != want {",
     ["./checkpoint/"], ""),
    ("safetensors header not padded to 8 bytes", "transformer/safetensors.go",
     "for len(js)%8 != 0 {", "for len(js)%1 != 0 {",
     ["./transformer/"], "Safetensors"),
    ("safetensors reader accepts trailing data", "transformer/safetensors.go",
     "if have := size - 8 - int64(n); have != int64(end) {", "if have := size - 8 - int64(n); have < int64(end) {",
     ["./transformer/"], "Safetensors"),
    ("TFRecord CRC not masked", "metrics/internal/tfevent/tfevent.go",
     "return ((c >> 15) | (c << 17)) + 0xa282ead8", "return c",
     ["./metrics/"], "Upstream|Proto"),
    ("text summary without its plugin name", "metrics/tfevents.go",
     'summary = appendPluginValue(summary, tag, "text", nil, tensor)', 'summary = appendPluginValue(summary, tag, "", nil, tensor)',
     ["./metrics/"], "Upstream|Proto"),
    ("gradient weighted by 1/N instead of n/N", "cmd/nmt-train/internal/train/train.go",
     "scale = float32(n / N)", "scale = float32(1 / N)",
     ["./cmd/nmt-train/"], "TestParity|TestResumeOnOtherRanks|TestKillAndResume"),
]


def sh(args, cwd, timeout=None):
    return subprocess.run(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)


def main():
    commit = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
    repo = sh(["git", "rev-parse", "--show-toplevel"], os.getcwd()).stdout.strip()
    rev = sh(["git", "rev-parse", "--short", commit], repo).stdout.strip()
    wt = tempfile.mkdtemp(prefix="gorun-mutate-")
    sh(["git", "worktree", "add", "--detach", wt, commit], repo)
    killed = applied = 0
    try:
        for name, path, orig, mut, pkgs, run in MUTATIONS:
            f = os.path.join(wt, path)
            src = open(f).read() if os.path.exists(f) else ""
            if src.count(orig) != 1:
                print("%-45s does not apply at %s" % (name, rev))
                continue
            open(f, "w").write(src.replace(orig, mut))
            args = ["go", "test", "-count=1", "-short", "-timeout", "600s"] + (["-run", run] if run else []) + pkgs
            try:
                r = sh(args, wt, timeout=700)
                failed = r.returncode != 0
                # a mutant that does not compile is not a test's catch
                broken = "[build failed]" in r.stdout or "[setup failed]" in r.stdout
            except subprocess.TimeoutExpired:
                failed, broken = True, False
            open(f, "w").write(src)
            if broken:
                print("%-45s does not compile at %s" % (name, rev))
                continue
            applied += 1
            killed += failed
            print("%-45s %s" % (name, "killed" if failed else "SURVIVED"))
    finally:
        sh(["git", "worktree", "remove", "--force", wt], repo)
    print("%s: %d of %d mutations killed" % (rev, killed, applied))


if __name__ == "__main__":
    main()
