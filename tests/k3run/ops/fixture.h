// Test helpers: reading the external conformance fixtures (tests/data/conformance/ops/*.json)
// and comparing arrays with a message that names fixture, field, index, got and want.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "k3run/ops/weights.h"

namespace k3::ops::testing {

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;  // row-major fp32 (the JSON decimals parsed as double, then rounded)
};

// One fixture file. Accessors throw std::runtime_error naming the fixture and the field when a
// field is missing or has the wrong kind (GoogleTest reports the exception as a failure).
class Fixture {
 public:
  static Fixture Load(const std::string& name);  // "mla" → tests/data/conformance/ops/mla.json
  static std::string Dir();

  const std::string& name() const { return name_; }
  bool Has(const std::string& field) const;
  const Tensor& T(const std::string& field) const;
  double Num(const std::string& field) const;
  // A [rows][prod(rest)] F32 matrix view of the tensor (e.g. conv [64,1,4] → [64][4]).
  Matrix F32(const std::string& field) const;
  Vec V(const std::string& field) const;

 private:
  std::string name_;
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, double> numbers_;
};

// The MANIFEST config as ops::Dims (fixture latent-norm eps 1e-5) and its tolerance.
Dims ManifestDims();
struct Tolerance {
  double abs = 1e-5, rel = 1e-4;
};
Tolerance ManifestTolerance();

// Element-wise |got − want| ≤ abs + rel·|want|; on failure lists the first mismatches as
// "<fixture>.<field>[index]: got G want W (|diff| D > bound B)" and the mismatch count.
::testing::AssertionResult AllNear(const std::string& fixture, const std::string& field,
                                   const float* got, const std::vector<float>& want,
                                   Tolerance tol = ManifestTolerance());
// max |got − want| ≤ bound (kda_decay's rule).
::testing::AssertionResult MaxAbsWithin(const std::string& fixture, const std::string& field,
                                        const float* got, const std::vector<float>& want,
                                        double bound);
// Largest |got − want| / (abs + rel·|want|); > 1 means outside tolerance. For reporting.
double WorstRatio(const float* got, const std::vector<float>& want, Tolerance tol);

}  // namespace k3::ops::testing
