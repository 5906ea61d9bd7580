// Host-side launch helpers of the CUDA kernels (matvec.cu, moe_experts.cu, attention.cu,
// deltanet.cu): the device's SM count, the launch settings (PDL, streamed and tensor-core
// products: chosen once from the device; tests and benchmarks change them through
// set_fused_launch, set_streamed_products and set_tensor_core_products), and cudaLaunchKernelEx
// with the PDL attribute and optional thread-block clusters.
// A kernel launched here with PDL on must run griddepcontrol.wait (pdl_wait_and_release,
// cuda_common.cuh) before it reads what its predecessor writes. Not part of the API.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

#include <algorithm>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

namespace swiftlet::cuda::detail {

inline int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    SWIFTLET_CUDA_CHECK(cudaGetDevice(&dev));
    SWIFTLET_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v > 0 ? v : 1;
  }();
  return n;
}

// The shared memory a block may opt in to (bytes): 227 KB on sm_90, 163 KB on sm_80, 99 KB on
// sm_86/89. Kernels that need more have a fallback.
inline int max_smem_per_block() {
  static const int n = [] {
    int dev = 0, v = 0;
    SWIFTLET_CUDA_CHECK(cudaGetDevice(&dev));
    SWIFTLET_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return v;
  }();
  return n;
}

// Launch settings (set_fused_launch, set_streamed_products): PDL on sm_90+, and blocks per SM of the products. Every block
// of a product stays resident and stages its x once; its warps then take row groups grid-stride.
// Fewer blocks per SM leave room for the successor's blocks to start early and prefetch.
struct Tuning {
  bool capable = false;  // sm_90+
  bool pdl = false;
  bool stream = false;  // the streamed products (sm_90+)
  int stream_warps = 16;  // warps per block of the streamed products (8 or 16)
  bool tc = false;  // the streamed products on the tensor cores where they fit
  int blocks_per_sm = 0;  // 0: by registers (R = 1, 2, 4 use ~45, ~80, ~115 per thread)
};
inline Tuning& tuning() {
  static Tuning t = [] {
    Tuning v;
    int dev = 0, major = 0;
    SWIFTLET_CUDA_CHECK(cudaGetDevice(&dev));
    SWIFTLET_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    v.capable = v.pdl = v.stream = v.tc = major >= 9;
    return v;
  }();
  return t;
}

// ask() for `key`, asked once: later calls with an equal key get the first answer (each call site
// its own cache: Ask is the site's lambda type).
template <typename Key, typename Ask>
int ask_once(const Key& key, Ask ask) {
  static std::mutex mu;
  static std::vector<std::pair<Key, int>> known;
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& [k, n] : known)
    if (k == key) return n;
  known.emplace_back(key, ask());
  return known.back().second;
}

// Blocks of `kernel` (`threads` a block, `smem` dynamic shared memory) that fit on one SM, asked
// once per kernel.
inline int occupancy(const void* kernel, size_t smem, int threads = 256) {
  return ask_once(kernel, [&] {
    int n = 0;
    SWIFTLET_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
    return n > 0 ? n : 1;
  });
}

// Thread-block clusters of `cluster` blocks of `kernel` (`threads` a block, `smem` dynamic shared
// memory) that the device holds at once, asked once per (kernel, cluster, smem).
inline int max_active_clusters(const void* kernel, unsigned cluster, int threads, size_t smem) {
  return ask_once(std::tuple(kernel, cluster, smem), [&] {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(cluster);
    cfg.blockDim = dim3(unsigned(threads));
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim = {cluster, 1, 1};
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int n = 0;
    SWIFTLET_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
    return n;
  });
}

// Launches kernel<<<grid, block, smem, s>>>(args...), with the PDL attribute when enabled. A
// grid-stride product kernel (resident) gets at most the blocks that are resident at once. With
// cluster > 0, blocks [c cluster, (c + 1) cluster) of grid.x form a thread-block cluster (sm_90).
template <typename... Params, typename... Args>
void launch_cluster(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, bool resident,
                    unsigned cluster, Args&&... args) {
  if (resident) {
    const unsigned cap = unsigned(occupancy(reinterpret_cast<const void*>(kernel), smem, int(block.x * block.y * block.z)) * sm_count());
    if (grid.x > cap) grid.x = cap;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (tuning().pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n++].val.clusterDim = {cluster, 1, 1};
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  SWIFTLET_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}
template <typename... Params, typename... Args>
void launch_ex(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, bool resident,
               Args&&... args) {
  launch_cluster(kernel, grid, block, smem, s, resident, 0, std::forward<Args>(args)...);
}
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  launch_ex(kernel, grid, block, smem, s, false, std::forward<Args>(args)...);
}

}  // namespace swiftlet::cuda::detail
