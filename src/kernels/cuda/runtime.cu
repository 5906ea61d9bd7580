// Device discovery, memory and timing helpers of the CUDA backend.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

#include <cstring>
#include <string>

namespace swiftlet::cuda {

bool cuda_available(std::string* reason) {
  auto no = [&](std::string why) {
    if (reason) *reason = std::move(why);
    return false;
  };
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return no(std::string("CUDA driver: ") + cudaGetErrorString(e));
  }
  if (n == 0) return no("no CUDA device found");
  cudaDeviceProp p{};
  e = cudaGetDeviceProperties(&p, 0);
  if (e != cudaSuccess) return no(std::string("CUDA device 0: ") + cudaGetErrorString(e));
  if (p.major < 8)
    return no(std::string("CUDA device 0 (") + p.name + ") has compute capability " + std::to_string(p.major) + "." +
              std::to_string(p.minor) + "; swiftlet's CUDA kernels need 8.0 or newer");
  // A context can still fail (e.g. a device in exclusive use): make one now.
  e = cudaFree(nullptr);
  if (e != cudaSuccess) return no(std::string("CUDA context: ") + cudaGetErrorString(e));
  if (reason) reason->clear();
  return true;
}

std::string device_description() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return {};
  }
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return {};
  char buf[96];
  std::snprintf(buf, sizeof buf, " (sm_%d%d, %d SMs, %.1f GiB, L2 %d MiB)", p.major, p.minor, p.multiProcessorCount,
                double(p.totalGlobalMem) / double(1ull << 30), p.l2CacheSize >> 20);
  return std::string(p.name) + buf;
}

void* gpu_alloc(size_t bytes) {
  void* d = nullptr;
  SWIFTLET_CUDA_CHECK(cudaMalloc(&d, bytes ? bytes : 1));
  return d;
}
void* gpu_try_alloc(size_t bytes) {
  void* d = nullptr;
  const cudaError_t e = cudaMalloc(&d, bytes ? bytes : 1);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // clear it: not sticky
    return nullptr;
  }
  SWIFTLET_CUDA_CHECK(e);
  return d;
}
void gpu_free(void* d) {
  if (d) SWIFTLET_CUDA_CHECK(cudaFree(d));
}
void* gpu_alloc_pinned(size_t bytes) {
  void* h = nullptr;
  SWIFTLET_CUDA_CHECK(cudaMallocHost(&h, bytes ? bytes : 1));
  return h;
}
void gpu_free_pinned(void* h) {
  if (h) SWIFTLET_CUDA_CHECK(cudaFreeHost(h));
}
void gpu_upload(void* d_dst, const void* h_src, size_t bytes, GpuStream s) {
  if (bytes) SWIFTLET_CUDA_CHECK(cudaMemcpyAsync(d_dst, h_src, bytes, cudaMemcpyHostToDevice, s));
}
void gpu_download(void* h_dst, const void* d_src, size_t bytes, GpuStream s) {
  if (bytes) SWIFTLET_CUDA_CHECK(cudaMemcpyAsync(h_dst, d_src, bytes, cudaMemcpyDeviceToHost, s));
  SWIFTLET_CUDA_CHECK(cudaStreamSynchronize(s));
}
void gpu_download_async(void* h_dst, const void* d_src, size_t bytes, GpuStream s) {
  if (bytes) SWIFTLET_CUDA_CHECK(cudaMemcpyAsync(h_dst, d_src, bytes, cudaMemcpyDeviceToHost, s));
}
void gpu_copy(void* d_dst, const void* d_src, size_t bytes, GpuStream s) {
  if (bytes) SWIFTLET_CUDA_CHECK(cudaMemcpyAsync(d_dst, d_src, bytes, cudaMemcpyDeviceToDevice, s));
}
void gpu_memset(void* d, int value, size_t bytes, GpuStream s) {
  if (bytes) SWIFTLET_CUDA_CHECK(cudaMemsetAsync(d, value, bytes, s));
}
void gpu_sync(GpuStream s) { SWIFTLET_CUDA_CHECK(cudaStreamSynchronize(s)); }

GpuStream stream_create() {
  cudaStream_t s;
  SWIFTLET_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}
void stream_destroy(GpuStream s) {
  if (s) SWIFTLET_CUDA_CHECK(cudaStreamDestroy(s));
}
GpuEvent event_create() {
  cudaEvent_t e;
  SWIFTLET_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}
void event_destroy(GpuEvent e) {
  if (e) SWIFTLET_CUDA_CHECK(cudaEventDestroy(e));
}
void event_record(GpuEvent e, GpuStream s) { SWIFTLET_CUDA_CHECK(cudaEventRecord(e, s)); }
void stream_wait(GpuStream s, GpuEvent e) { SWIFTLET_CUDA_CHECK(cudaStreamWaitEvent(s, e, 0)); }
void event_sync(GpuEvent e) { SWIFTLET_CUDA_CHECK(cudaEventSynchronize(e)); }
GpuEvent event_create_timed() {
  cudaEvent_t e;
  SWIFTLET_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}
float event_elapsed_ms(GpuEvent start, GpuEvent end) {
  float ms = 0.0f;
  SWIFTLET_CUDA_CHECK(cudaEventElapsedTime(&ms, start, end));
  return ms;
}
void device_memory(size_t* free_bytes, size_t* total_bytes) {
  SWIFTLET_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

double gpu_time_ms(const std::function<void()>& fn, int iters, GpuStream s) {
  cudaEvent_t a, b;
  SWIFTLET_CUDA_CHECK(cudaEventCreate(&a));
  SWIFTLET_CUDA_CHECK(cudaEventCreate(&b));
  fn();
  SWIFTLET_CUDA_CHECK(cudaEventRecord(a, s));
  for (int i = 0; i < iters; ++i) fn();
  SWIFTLET_CUDA_CHECK(cudaEventRecord(b, s));
  SWIFTLET_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  SWIFTLET_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  SWIFTLET_CUDA_CHECK(cudaEventDestroy(a));
  SWIFTLET_CUDA_CHECK(cudaEventDestroy(b));
  return double(ms) / double(iters > 0 ? iters : 1);
}

namespace {
size_t elem_size(WeightFormat f) { return f == WeightFormat::F32 ? 4 : 2; }
size_t scale_size(DType t) { return t == DType::F32 ? 4 : 2; }
size_t align_up(size_t n) { return (n + 255) & ~size_t(255); }
}  // namespace

size_t matrix_data_bytes(const QMatrix& w) {
  if (w.format == WeightFormat::Affine) return size_t(w.rows) * size_t(w.cols) * size_t(w.bits) / 8;
  return size_t(w.rows) * size_t(w.cols) * elem_size(w.format);
}

size_t matrix_scale_bytes(const QMatrix& w) {
  if (w.format != WeightFormat::Affine) return 0;
  return size_t(w.rows) * size_t(w.cols / w.group_size) * scale_size(w.scale_dtype);
}

GpuMatrix matrix_layout(const QMatrix& w, const void* d_base) {
  GpuMatrix g;
  g.format = w.format;
  g.rows = w.rows;
  g.cols = w.cols;
  g.bits = w.bits;
  g.group_size = w.group_size;
  g.scale_dtype = w.scale_dtype;
  const uintptr_t base = reinterpret_cast<uintptr_t>(d_base);
  const size_t db = align_up(matrix_data_bytes(w)), sb = align_up(matrix_scale_bytes(w));
  g.data = d_base;
  if (w.format == WeightFormat::Affine) {
    g.scales = reinterpret_cast<const void*>(base + db);
    g.biases = reinterpret_cast<const void*>(base + db + sb);
  }
  return g;
}

GpuMatrix upload_matrix_to(const QMatrix& w, void* d_dst, GpuStream s) {
  SWIFTLET_CUDA_REQUIRE(w.format != WeightFormat::Affine || w.scale_dtype == DType::BF16 ||
                        w.scale_dtype == DType::F16 || w.scale_dtype == DType::F32);
  const GpuMatrix g = matrix_layout(w, d_dst);
  gpu_upload(const_cast<void*>(g.data), w.data, matrix_data_bytes(w), s);
  if (w.format == WeightFormat::Affine) {
    gpu_upload(const_cast<void*>(g.scales), w.scales, matrix_scale_bytes(w), s);
    gpu_upload(const_cast<void*>(g.biases), w.biases, matrix_scale_bytes(w), s);
  }
  return g;
}

ExpertLayout upload_expert_to(const QMatrix& gate, const QMatrix& up, const QMatrix& down, void* d_slot,
                              GpuStream s) {
  const size_t gb = matrix_device_bytes(gate), ub = matrix_device_bytes(up);
  auto* base = static_cast<uint8_t*>(d_slot);
  upload_matrix_to(gate, base, s);
  upload_matrix_to(up, base + gb, s);
  upload_matrix_to(down, base + gb + ub, s);
  auto offset = [](size_t b) { return reinterpret_cast<const void*>(b); };
  return {matrix_layout(gate, offset(0)), matrix_layout(up, offset(gb)), matrix_layout(down, offset(gb + ub))};
}

size_t matrix_device_bytes(const QMatrix& w) {
  return align_up(matrix_data_bytes(w)) + 2 * align_up(matrix_scale_bytes(w));
}

GpuMatrix upload_matrix(const QMatrix& w, void** d_owner, GpuStream s) {
  *d_owner = gpu_alloc(matrix_device_bytes(w));
  return upload_matrix_to(w, *d_owner, s);
}

// ---------------------------------------------------------------------------------------------
// CUDA graphs, and a decode step's token and position written in stream order (graph replay).

namespace {
__global__ void set_step_kernel(int32_t* a, int32_t av, int64_t* b, int64_t bv) {
  *a = av;
  *b = bv;
}
}  // namespace

void set_step(int32_t* d_i32, int32_t a, int64_t* d_i64, int64_t b, GpuStream s) {
  set_step_kernel<<<1, 1, 0, s>>>(d_i32, a, d_i64, b);
  SWIFTLET_CUDA_LAUNCHED();
}

void graph_capture_begin(GpuStream s) {
  SWIFTLET_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
}
GpuGraph graph_capture_end(GpuStream s) {
  cudaGraph_t g;
  SWIFTLET_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t e;
  SWIFTLET_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  SWIFTLET_CUDA_CHECK(cudaGraphDestroy(g));
  return e;
}
void graph_launch(GpuGraph g, GpuStream s) { SWIFTLET_CUDA_CHECK(cudaGraphLaunch(g, s)); }
void graph_destroy(GpuGraph g) {
  if (g) SWIFTLET_CUDA_CHECK(cudaGraphExecDestroy(g));
}

}  // namespace swiftlet::cuda
