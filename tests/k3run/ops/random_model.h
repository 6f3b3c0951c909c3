// Deterministic random weights for tests that compare the ops with themselves (bit-identity
// across ISA paths, threads, T rows vs single steps). BF16 trunk matrices and MXFP4 routed
// experts, so every kernel path the model uses is exercised; small vectors fp32.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <vector>

#include "k3run/ops/moe.h"
#include "k3run/ops/weights.h"

namespace k3::ops::testing {

// Small dimensions with the tiny preset's structure (all widths multiples of 32 for MXFP4).
Dims RandomDims();

class RandomModel {
 public:
  explicit RandomModel(const Dims& d, uint32_t seed = 7);

  // A KDA or MLA layer, dense or MoE. The views stay valid while this object lives.
  LayerWeights Layer(bool mla, bool dense);
  // Every routed expert by id (valid until the next Layer call).
  ExpertTable Experts() const;

  // Random activations [n], normal(0, scale).
  std::vector<float> Activations(int64_t n, float scale = 1.0f);

 private:
  Matrix Bf16(int64_t rows, int64_t cols, float scale);
  Matrix F32(int64_t rows, int64_t cols, float scale);
  Matrix Mxfp4(int64_t rows, int64_t cols);
  Vec Floats(int64_t n, float mean, float scale);

  Dims d_;
  std::mt19937 rng_;
  // deque: growing it never moves the buffers the views point at
  std::deque<std::vector<uint16_t>> bf16_;
  std::deque<std::vector<float>> f32_;
  std::deque<std::vector<uint8_t>> u8_;
  std::vector<GluWeights> experts_;
  mutable std::vector<const GluWeights*> table_;  // Experts()
};

}  // namespace k3::ops::testing
