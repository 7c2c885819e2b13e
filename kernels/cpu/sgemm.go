// Package cpu is the pure Go compute backend.
package cpu

// Sgemm computes C = alpha*op(A)*op(B) + beta*C for row-major matrices, where
// op(X) is X or its transpose. op(A) is m x k, op(B) is k x n, C is m x n.
// lda, ldb, ldc are the row strides of A, B and C as stored.
//
// This is the reference version; the blocked, packed, multi-core version
// with assembly micro-kernels replaces its body without changing the API.
func Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float32
			for p := 0; p < k; p++ {
				var av, bv float32
				if transA {
					av = a[p*lda+i]
				} else {
					av = a[i*lda+p]
				}
				if transB {
					bv = b[j*ldb+p]
				} else {
					bv = b[p*ldb+j]
				}
				s += av * bv
			}
			if beta == 0 {
				c[i*ldc+j] = alpha * s
			} else {
				c[i*ldc+j] = alpha*s + beta*c[i*ldc+j]
			}
		}
	}
}

// SgemmStrided runs batch independent Sgemm calls whose matrices are
// strideA, strideB, strideC elements apart.
func SgemmStrided(batch int, transA, transB bool, m, n, k int, alpha float32, a []float32, lda, strideA int, b []float32, ldb, strideB int, beta float32, c []float32, ldc, strideC int) {
	for i := 0; i < batch; i++ {
		Sgemm(transA, transB, m, n, k, alpha, a[i*strideA:], lda, b[i*strideB:], ldb, beta, c[i*strideC:], ldc)
	}
}
