// Call 4's timing: the 16-bit dense layers' weight gradient dW[OC,IC] += dout[N,OC]^T inp[N,IC]
// (bf16 operands, fp32 output accumulated, as matmul.cu's does) in cuBLASLt with and without
// the bias gradient in its epilogue (CUBLASLT_EPILOGUE_BGRADB), for GPT-2 small's four
// shapes at batch 32 and 64 (N = 32768, 65536); each time is the mean of 50 calls after 5.
// It also checks the bias gradient against a host sum. Built and run as:
//   nvcc -O2 -gencode arch=compute_90,code=sm_90 call4-bgradb-timing.cu -lcublasLt -o bgrad
//   CUDA_VISIBLE_DEVICES=0 ./bgrad
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cmath>
#define CK(x) do { auto e = (x); if ((int)e != 0) { printf("error %d at %s:%d\n", (int)e, __FILE__, __LINE__); exit(1);} } while (0)

struct Result { float ms; bool ok; int algo_tile; };

float run(cublasLtHandle_t lt, void* ws, size_t wsb, bool bgrad, int N, int IC, int OC,
          __nv_bfloat16* inp, __nv_bfloat16* dout, float* dw, float* db, cudaStream_t s, bool* supported) {
  cublasLtMatmulDesc_t desc;
  CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_T;
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (bgrad) {
    cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BGRADB;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &db, sizeof(db)));
  }
  cublasLtMatrixLayout_t a, b, d;
  CK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, IC, N, IC));   // inp col-major [IC, N]
  CK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, OC, N, OC));   // dout col-major [OC, N], op T -> [N, OC]
  CK(cublasLtMatrixLayoutCreate(&d, CUDA_R_32F, IC, OC, IC));
  cublasLtMatmulPreference_t pref;
  CK(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t w = wsb;
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &w, sizeof(w)));
  cublasLtMatmulHeuristicResult_t res[8]; int found = 0;
  auto st = cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, d, d, pref, 8, res, &found);
  *supported = st == 0 && found > 0;
  if (!*supported) { printf("  no algorithm (status %d, found %d)\n", (int)st, found); return -1; }
  float alpha = 1, beta = 1;
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (int i = 0; i < 5; ++i) CK(cublasLtMatmul(lt, desc, &alpha, inp, a, dout, b, &beta, dw, d, dw, d, &res[0].algo, ws, wsb, s));
  cudaEventRecord(e0, s);
  const int reps = 50;
  for (int i = 0; i < reps; ++i) CK(cublasLtMatmul(lt, desc, &alpha, inp, a, dout, b, &beta, dw, d, dw, d, &res[0].algo, ws, wsb, s));
  cudaEventRecord(e1, s); cudaEventSynchronize(e1);
  float ms; cudaEventElapsedTime(&ms, e0, e1);
  return ms / reps;
}

int main() {
  cublasLtHandle_t lt; CK(cublasLtCreate(&lt));
  size_t wsb = 32 << 20; void* ws; CK(cudaMalloc(&ws, wsb));
  cudaStream_t s; cudaStreamCreate(&s);
  int shapes[4][2] = {{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}};
  for (int N : {32768, 65536}) {
    for (auto& sh : shapes) {
      int IC = sh[0], OC = sh[1];
      __nv_bfloat16 *inp, *dout; float *dw, *db;
      CK(cudaMalloc(&inp, size_t(N) * IC * 2)); CK(cudaMalloc(&dout, size_t(N) * OC * 2));
      CK(cudaMalloc(&dw, size_t(IC) * OC * 4)); CK(cudaMalloc(&db, OC * 4));
      std::vector<__nv_bfloat16> h(size_t(N) * OC);
      for (size_t i = 0; i < h.size(); ++i) h[i] = __float2bfloat16(float((i * 2654435761u) % 1000) / 1000.0f - 0.5f);
      CK(cudaMemcpy(dout, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
      std::vector<__nv_bfloat16> hi(size_t(N) * IC, __float2bfloat16(0.01f));
      CK(cudaMemcpy(inp, hi.data(), hi.size() * 2, cudaMemcpyHostToDevice));
      bool sup0, sup1;
      float plain = run(lt, ws, wsb, false, N, IC, OC, inp, dout, dw, db, s, &sup0);
      float fused = run(lt, ws, wsb, true, N, IC, OC, inp, dout, dw, db, s, &sup1);
      double maxerr = 0;
      if (sup1) {
        std::vector<float> got(OC); CK(cudaMemcpy(got.data(), db, OC * 4, cudaMemcpyDeviceToHost));
        for (int c = 0; c < OC; ++c) { double ref = 0; for (int n = 0; n < N; ++n) ref += __bfloat162float(h[size_t(n) * OC + c]); maxerr = fmax(maxerr, fabs(ref - got[c]) / fmax(1.0, fabs(ref))); }
      }
      printf("N %d IC %d OC %d: plain %.1f us, bgradb %.1f us, bias grad max rel err %.2e\n", N, IC, OC, plain * 1e3, fused * 1e3, maxerr);
      cudaFree(inp); cudaFree(dout); cudaFree(dw); cudaFree(db);
    }
  }
  return 0;
}
