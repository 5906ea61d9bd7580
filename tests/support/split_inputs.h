// Qwen3-Next's DeltaNet inputs in tests: which rows of a checkpoint's fused in_proj_qkvz /
// in_proj_ba a container's split in_proj_qkv / in_proj_z / in_proj_b / in_proj_a tensor holds
// (DeltaNetLayout, docs/qpack.md 4), and a row-by-row byte comparison of the two.
#pragma once

#include "format/hf_config.h"
#include "format/safetensors.h"
#include "model/weights.h"

#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace swiftlet::testing {

struct FusedRows {
  std::string fused_name;     // the checkpoint's tensor, same suffix (.weight, .scales, .biases)
  std::vector<int64_t> rows;  // row i of the split tensor is row rows[i] of the fused one
  int64_t fused_rows = 0;
};

// Where container tensor `name` comes from when it is a split input of a Qwen3-Next model;
// nullopt for every other tensor (and for Qwen3.5, whose checkpoints are split already).
inline std::optional<FusedRows> fused_rows_of(const ModelConfig& c, const std::string& name) {
  if (c.family != Family::Qwen3Next) return std::nullopt;
  struct Part {
    const char* split;
    const char* fused;
    FusedInput which;
    int64_t first, count;
  };
  const int64_t C = c.conv_dim(), vd = c.linear_value_dim(), hv = c.linear_num_value_heads;
  const Part parts[] = {{".linear_attn.in_proj_qkv.", ".linear_attn.in_proj_qkvz.", FusedInput::Qkvz, 0, C},
                        {".linear_attn.in_proj_z.", ".linear_attn.in_proj_qkvz.", FusedInput::Qkvz, C, vd},
                        {".linear_attn.in_proj_b.", ".linear_attn.in_proj_ba.", FusedInput::Ba, 0, hv},
                        {".linear_attn.in_proj_a.", ".linear_attn.in_proj_ba.", FusedInput::Ba, hv, hv}};
  for (const Part& p : parts) {
    const size_t at = name.find(p.split);
    if (at == std::string::npos) continue;
    const std::vector<int64_t> order = split_row_order(c, p.which);
    FusedRows r;
    r.fused_name = name.substr(0, at) + p.fused + name.substr(at + std::strlen(p.split));
    r.rows.assign(order.begin() + p.first, order.begin() + p.first + p.count);
    r.fused_rows = int64_t(order.size());
    return r;
  }
  return std::nullopt;
}

// Row i of `split` equals row f.rows[i] of `fused`, byte for byte.
inline void expect_rows_from(const TensorView& fused, const TensorView& split, const FusedRows& f) {
  ASSERT_EQ(fused.dtype, split.dtype) << split.name;
  ASSERT_EQ(fused.nbytes % size_t(f.fused_rows), 0u) << fused.name;
  const size_t row = fused.nbytes / size_t(f.fused_rows);
  ASSERT_EQ(split.nbytes, row * f.rows.size()) << split.name;
  ASSERT_EQ(split.shape[0], int64_t(f.rows.size())) << split.name;
  for (size_t i = 0; i < f.rows.size(); ++i)
    ASSERT_EQ(0, std::memcmp(split.data + i * row, fused.data + size_t(f.rows[i]) * row, row))
        << split.name << " row " << i << " is not row " << f.rows[i] << " of " << fused.name;
}

}  // namespace swiftlet::testing
