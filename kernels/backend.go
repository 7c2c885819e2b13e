package kernels

import (
	"fmt"

	"github.com/gorun/gorun/dtype"
)

// AttnArgs describes one multi-head scaled-dot-product attention call.
//
// Q is [B, Sq, H*Dh]; K and V are [B, SkCap, H*Dh] of which the first Sk
// positions are used (SkCap > Sk lets incremental decoding attend over a
// growing key/value cache). Probs is [B, H, Sq, Sk] and keeps the softmax
// (before dropout) for the backward pass. O is [B, Sq, H*Dh].
type AttnArgs struct {
	B, H, Sq, Sk, Dh int
	// KeyLen, when set (I32, [B]), masks keys at positions >= KeyLen[b]
	// (padding). A row whose keys are all masked attends uniformly to none:
	// its output is zero.
	KeyLen Tensor
	// Causal masks key j > query i (decoder self-attention).
	Causal bool
	// Scale multiplies the scores (Dh^-0.5).
	Scale float32
	// Dropout on the attention weights, regenerated from Seed in backward.
	Dropout float32
	Seed    uint64
}

// MustCheck is Check for a backend's Attention and AttentionBackward: a
// wrong shape is a programming error, so it panics with the backend's
// name and Check's message.
func (a AttnArgs) MustCheck(backend string, o, probs, q, k, v Tensor) int {
	skCap, err := a.Check(o, probs, q, k, v)
	if err != nil {
		panic(backend + ": " + err.Error())
	}
	return skCap
}

// Check validates the shapes of an Attention call (o is the output, or
// dO in backward) and returns SkCap, the key/value capacity per batch
// row; the error names every shape.
func (a AttnArgs) Check(o, probs, q, k, v Tensor) (int, error) {
	D := a.H * a.Dh
	skCap := k.Dim(-2)
	if q.Len() != a.B*a.Sq*D || o.Len() != a.B*a.Sq*D || k.Len() != a.B*skCap*D || v.Len() != k.Len() ||
		probs.Len() != a.B*a.H*a.Sq*a.Sk || a.Sk > skCap || (a.KeyLen.Rank > 0 && a.KeyLen.Len() != a.B) {
		return 0, fmt.Errorf("Attention shapes o %v probs %v q %v k %v v %v args %+v", o, probs, q, k, v, a)
	}
	return skCap, nil
}

// AdamArgs are the hyper-parameters of one Adam update. LR is the step size
// with the bias correction already folded in, as TensorFlow's Adam does:
// lr_t = lr * sqrt(1-beta2^t) / (1-beta1^t); the update is
// p -= lr_t * m / (sqrt(v) + Eps).
type AdamArgs struct {
	LR, Beta1, Beta2, Eps float32
	// SkipOnOverflow: on a backend with DeferredScalars, the update leaves
	// p, m and v as they are when the backend's FlagOverflow is raised by
	// the time it runs (a step whose gradients were found not finite
	// without a synchronisation; DeferredScalars). Other backends have no
	// flags and update.
	SkipOnOverflow bool
}

// MixedPrecision is implemented by backends that train in mixed
// precision (the CUDA backend). Their ops take activations in F16 or BF16
// as well as F32: every tensor argument of an op except parameters (bias,
// gamma, beta, table, pe, the Adam tensors), parameter gradients (dbias,
// dgamma, dbeta, dtable), LayerNorm's mean and rstd, and ids, all the
// activations of one call in one type; their arithmetic is float32, the
// results rounded to the activations' type. SetMatmulPrecision(F16 or
// BF16) also rounds float32 inputs of matrix products to that type
// (tensor cores, float32 accumulation and output; F32 turns it off); a
// product with a half-precision operand runs in that type regardless.
type MixedPrecision interface {
	SetMatmulPrecision(dt dtype.DType)
}

// CastCache is implemented by backends that round float32 operands of
// matrix products to 16 bits (MixedPrecision's tensor-core products): the
// rounded copy of any part of the float32 tensor w given to CacheCasts is
// kept until the backend's next write to that part (an optimizer update,
// an Upload, ...), so that a weight is cast once per step, not once per
// product that reads it. w must change only through the backend's ops.
// A later call replaces the region; Free of w ends it.
type CastCache interface {
	CacheCasts(w Tensor)
}

// DeferredScalars is implemented by a backend whose scalar results cost a
// synchronisation with the host (a GPU: the host waits for everything
// queued before). A training step queues them instead (the loss, the
// gradients' and the weights' Inf/NaN checks, an update that an overflow
// cancels) and reads them all with one synchronisation, at its end.
type DeferredScalars interface {
	// CrossEntropySum is CrossEntropy whose loss sum and row count are
	// added to the backend's loss accumulator instead of being returned.
	CrossEntropySum(dlogits, logits, targets Tensor, ls float32, padID int32, gradScale float32)
	// FlagInfNaN raises flag f (FlagOverflow or FlagWeights) when x holds
	// an Inf or a NaN (HasInfNaN without the read-back).
	FlagInfNaN(x Tensor, f int)
	// TakeScalars waits for the queued work (one synchronisation) and
	// returns the loss accumulator (sum and count) and the two flags, and
	// clears them.
	TakeScalars() (sum float64, count int, flags [2]bool)
}

// The flags of DeferredScalars: FlagOverflow (the gradients; Adam's
// SkipOnOverflow reads it) and FlagWeights (the weights after an update).
const (
	FlagOverflow = 0
	FlagWeights  = 1
)

// Backend is the set of ops the Transformer needs. Every op takes Tensors
// that live on the backend's device; outputs are preallocated by the caller,
// so a training step allocates nothing in the steady state. Ops whose name
// ends in Backward accumulate (+=) into parameter gradients, and into dx
// where the documentation says so, so that residual branches add up without
// extra buffers.
type Backend interface {
	Name() string
	Device() Device
	// Alloc returns a zeroed tensor.
	Alloc(dt dtype.DType, dims ...int) Tensor
	// Free gives back a tensor that Alloc returned (not a view of one);
	// it and its views must not be used afterwards. The CPU backend leaves
	// it to the garbage collector; a device backend reuses the memory.
	Free(t Tensor)
	// Upload / Download copy between host slices and a tensor.
	Upload(dst Tensor, src []float32)
	UploadI32(dst Tensor, src []int32)
	Download(dst []float32, src Tensor)
	Copy(dst, src Tensor)
	Zero(t Tensor)
	// Cast converts between F32, F16 and BF16 (round to nearest even); dst
	// and src have the same length.
	Cast(dst, src Tensor)
	// Scale: x *= s.
	Scale(x Tensor, s float32)
	// Axpy: y += a*x.
	Axpy(y Tensor, a float32, x Tensor)
	// HasInfNaN reports whether x holds an Inf or a NaN.
	HasInfNaN(x Tensor) bool
	// SumSquares returns the sum of x*x (for gradient norms).
	SumSquares(x Tensor) float64

	// Gemm: C = alpha*op(A)*op(B) + beta*C, on the last two dimensions, for
	// 2-D tensors or a batch of them (leading dimensions equal). A 2-D A
	// may be given a (rows, cols) view of any tensor: A is read as
	// A.Rows() x A.Cols(). In a batch (C of rank 3 or 4), A or B may be a
	// single matrix (its length that of one), used for every member of
	// the batch: one product of one input with several weight matrices
	// laid out one after another (the Transformer's Q, K and V
	// projections), or the weight gradients of several such products.
	Gemm(transA, transB bool, alpha float32, a, b Tensor, beta float32, c Tensor)

	// AddBias: x[r,:] += bias. BiasGrad: dbias += sum over rows of dy.
	AddBias(x, bias Tensor)
	BiasGrad(dbias, dy Tensor)
	// BiasReLU: x = max(0, x + bias) in place. ReLUBackward: dx *= (y > 0)
	// where y is the ReLU output.
	BiasReLU(x, bias Tensor)
	ReLUBackward(dx, y Tensor)
	// BiasReLUDropout is BiasReLU(x, bias) then Dropout(y, x, p, seed) as
	// one op (one kernel on a GPU): x = max(0, x + bias) in place, y its
	// dropout (the feed-forward layer's hidden units). y may alias x (x
	// then ends as y).
	BiasReLUDropout(y, x, bias Tensor, p float32, seed uint64)

	// LayerNorm over the last dimension: y = (x-mean)*rstd*gamma + beta,
	// saving mean and rstd ([rows]). LayerNormBackward adds into dx, dgamma
	// and dbeta.
	LayerNorm(y, mean, rstd, x, gamma, beta Tensor, eps float32)
	LayerNormBackward(dx, dgamma, dbeta, dy, x, mean, rstd, gamma Tensor)

	// Dropout: y = x * keep / (1-p), keep drawn from (seed, element index),
	// so Backward regenerates it. y may alias x. DropoutBackward likewise
	// with dx = dy * keep / (1-p).
	Dropout(y, x Tensor, p float32, seed uint64)
	DropoutBackward(dx, dy Tensor, p float32, seed uint64)
	// ResidualDropout: out = res + dropout(y). out may alias res.
	ResidualDropout(out, res, y Tensor, p float32, seed uint64)
	// ResidualDropoutLayerNorm is ResidualDropout(out, res, x, p, seed)
	// (with res empty: Dropout(out, x, p, seed)) then LayerNorm(y, mean,
	// rstd, out, gamma, beta, eps) as one op (one kernel on a GPU): a
	// residual connection and the layer norm that reads it next. The
	// layer norm reads out as stored (in its type). out may alias res or
	// x; y must alias neither.
	ResidualDropoutLayerNorm(out, y, mean, rstd, res, x, gamma, beta Tensor, p float32, seed uint64, eps float32)

	// Embedding: out[i,:] = table[ids[i],:] * scale, and zero where
	// ids[i] == padID (OpenSeq2Seq zeroes padding embeddings).
	// EmbeddingBackward: dtable[ids[i],:] += dout[i,:] * scale for ids[i]
	// != padID.
	Embedding(out, table, ids Tensor, scale float32, padID int32)
	EmbeddingBackward(dtable, dout, ids Tensor, scale float32, padID int32)
	// AddPositional: x[b,t,:] += pe[t0+t,:] for x [B, T, D], pe [maxT, D].
	AddPositional(x, pe Tensor, t0 int)

	// Attention: multi-head attention with padding/causal masks, dropout on
	// the weights. AttentionBackward writes (not accumulates) dq, dk, dv
	// (same layouts as q, k, v) and uses dprobs ([B,H,Sq,Sk]) as scratch.
	Attention(o, probs, q, k, v Tensor, a AttnArgs)
	AttentionBackward(dq, dk, dv, dprobs, do, q, k, v, probs Tensor, a AttnArgs)

	// CrossEntropy over logits [N, V] and targets [N] (I32) with label
	// smoothing ls (target gets 1-ls, every other id ls/(V-1)); rows whose
	// target is padID count for nothing. Returns the summed loss and the
	// number of counted rows. If dlogits is non-empty (it may alias logits)
	// it receives gradScale * d(loss)/d(logits).
	CrossEntropy(dlogits, logits, targets Tensor, ls float32, padID int32, gradScale float32) (sum float64, count int)
	// LogSoftmax: out = log(softmax(x)) row-wise (decoding). out may alias x.
	LogSoftmax(out, x Tensor)

	// Adam: dense update of p with gradient g and moments m, v.
	Adam(p, g, m, v Tensor, a AdamArgs)
	// AdamRows: LazyAdam's sparse update: only the listed rows (I32) of the
	// [rows, cols] parameter are updated, other rows keep p, m and v.
	AdamRows(p, g, m, v, rows Tensor, a AdamArgs)

	// GatherRows: dst[i, :cols] = src[idx[i], :cols], rows being the first
	// dimension (beam reordering of decoder caches). dst must not alias src.
	GatherRows(dst, src, idx Tensor, cols int)
	// WriteStep: cache[r, t, :] = x[r, :] for cache [R, Tcap, D], x [R, D]
	// (appending a position to a key/value cache).
	WriteStep(cache, x Tensor, t int)

	// Orthonormalize makes the columns of the [rows, cols] matrix p (2-D,
	// or a batch [n, rows, cols] of them, each on its own) orthonormal in
	// place, left to right, as PowerSGD does (modified Gram-Schmidt): for
	// j = 0, 1, ..., with nrm the norm of column j as it stands then, the
	// projection of every later column k on it, (p_j.p_k / nrm^2) p_j, is
	// subtracted from column k, and column j is divided by nrm + eps.
	// (PowerSGD's code subtracts (q_j.p_k) q_j with q_j = p_j/(nrm+eps),
	// which leaves 2*eps/nrm of p_j in column k.) A column whose nrm is at
	// most OrthoDropTol times its norm in the input (a column that depends
	// linearly on earlier ones, to rounding; a zero column) is set to zero
	// instead, and nothing is subtracted on its account. F32 only; norms
	// and dot products are summed in float64 (or as accurately), and the
	// result does not depend on the number of threads. cols is small
	// (PowerSGD's rank; the CUDA backend allows at most OrthoMaxCols),
	// rows may be large.
	Orthonormalize(p Tensor, eps float32)

	// Sync waits for queued work (no-op on the CPU).
	Sync()
}

// OrthoDropTol is the relative norm below which Orthonormalize zeroes a
// column instead of normalizing it. PowerSGD's own code would divide the
// rounding residue of a dependent column (about 1e-7 of its norm in
// float32, at most cols*2^-24) by its tiny norm plus eps and so make a
// unit column of rounding noise, neither orthogonal to the earlier
// columns nor the same on two backends; 1e-4 is 25x above that residue
// for 64 columns, and a genuine column that has lost all but 1e-4 of
// its norm to the earlier ones carries 1e-8 of its energy.
const OrthoDropTol = 1e-4

// OrthoMaxCols is the largest number of columns a device backend's
// Orthonormalize takes (PowerSGD's rank is at most 64 in practice).
const OrthoMaxCols = 64
