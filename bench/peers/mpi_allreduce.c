// The OpenMPI peer of gorun's allreduce benchmarks (bench/peers/allreduce_peers.sh,
// multihost_busbw.sh, cpu_ab.sh): build with mpicc -O2 -o mpi_allreduce mpi_allreduce.c -lm.
// MPI_Allreduce(MPI_FLOAT, MPI_SUM) out-of-place bandwidth benchmark, nccl-tests style columns.
// Usage: mpirun -np N ./mpi_allreduce [budget_seconds_per_size] [sizes in bytes...]
// For each size: warm-up (>= 0.5 s), pick `inner` ops per sample so a sample lasts >= 2 ms, then
// samples = clamp(budget / sample_time, 5, 100). Each sample = barrier; time `inner` ops;
// per-op time = max over ranks. Reports the median (and best) per-op time,
// algbw = bytes/time, busbw = algbw * 2(n-1)/n, GB = 1e9 bytes.
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return (x > y) - (x < y); }

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n; MPI_Comm_rank(MPI_COMM_WORLD, &rank); MPI_Comm_size(MPI_COMM_WORLD, &n);
  double budget = argc > 1 ? atof(argv[1]) : 8.0;
  size_t defsz[] = {4UL << 10, 64UL << 10, 1UL << 20, 16UL << 20, 64UL << 20, 256UL << 20};
  int nsz = argc > 2 ? argc - 2 : 6;
  size_t *sizes = malloc(sizeof(size_t) * nsz);
  for (int i = 0; i < nsz; i++) sizes[i] = argc > 2 ? strtoull(argv[i + 2], 0, 10) : defsz[i];
  size_t maxsz = 0; for (int i = 0; i < nsz; i++) if (sizes[i] > maxsz) maxsz = sizes[i];
  float *sb = malloc(maxsz), *rb = malloc(maxsz);
  for (size_t i = 0; i < maxsz / 4; i++) { sb[i] = (float)(rank + 1); rb[i] = 0.f; }
  if (rank == 0) {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING]; int len; MPI_Get_library_version(lib, &len);
    char *nl = strchr(lib, '\n'); if (nl) *nl = 0;
    printf("# %s; np=%d; budget %.1fs/size\n", lib, n, budget);
    printf("%12s %8s %6s %6s %12s %10s %10s %10s\n", "bytes", "np", "inner", "samp", "median_us", "algbw", "busbw", "best_busbw");
  }
  for (int s = 0; s < nsz; s++) {
    size_t bytes = sizes[s]; int count = (int)(bytes / 4);
    // correctness check + warm-up
    MPI_Allreduce(sb, rb, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    float want = n * (n + 1) / 2.0f;
    if (rb[0] != want || rb[count - 1] != want) { fprintf(stderr, "rank %d: bad result %f (want %f)\n", rank, rb[0], want); MPI_Abort(MPI_COMM_WORLD, 1); }
    // warm-up in rounds of `warm` ops until >= 0.5 s spent (all ranks agree via MAX); est = last round
    int warm = bytes >= (16UL << 20) ? 2 : 20;
    double spent = 0, est = 0;
    for (int round = 0; round < 50 && spent < 0.5; round++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int w = 0; w < warm; w++) MPI_Allreduce(sb, rb, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double d = MPI_Wtime() - t0;
      MPI_Allreduce(MPI_IN_PLACE, &d, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      spent += d; est = d / warm;
    }
    int inner = (int)ceil(2e-3 / est); if (inner < 1) inner = 1; if (inner > 1000) inner = 1000;
    int samp = (int)(budget / (est * inner)); if (samp < 5) samp = 5; if (samp > 100) samp = 100;
    double *ts = malloc(sizeof(double) * samp);
    for (int k = 0; k < samp; k++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double a = MPI_Wtime();
      for (int i = 0; i < inner; i++) MPI_Allreduce(sb, rb, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double t = (MPI_Wtime() - a) / inner;
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      ts[k] = t;
    }
    qsort(ts, samp, sizeof(double), cmp);
    double med = ts[samp / 2], best = ts[0], f = 2.0 * (n - 1) / n;
    if (rank == 0)
      printf("%12zu %8d %6d %6d %12.1f %10.3f %10.3f %10.3f\n", bytes, n, inner, samp, med * 1e6, bytes / med / 1e9, bytes / med / 1e9 * f, bytes / best / 1e9 * f);
    fflush(stdout);
    free(ts);
  }
  free(sb); free(rb); free(sizes);
  MPI_Finalize();
  return 0;
}
