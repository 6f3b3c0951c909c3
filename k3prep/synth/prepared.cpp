// A synthetic checkpoint's prepared directory in memory (see k3prep/synth/prepared.h).
#include "k3prep/synth/prepared.h"

#include <string>
#include <vector>

#include "common/env.h"
#include "k3prep/pack/manifest.h"

namespace k3::synth {

Result<prepared::PreparedDir> PreparedForConfig(const ModelConfig& c, SmallDType small) {
  // Env only sizes shard headers (nothing is written).
  K3_ASSIGN_OR_RETURN(const Layout layout, BuildLayout(Env::Default(), c, small, 0));
  std::vector<prepared::TensorSpec> tensors;
  tensors.reserve(layout.tensors.size());
  for (const TensorPlan& t : layout.tensors) {
    tensors.push_back(prepared::TensorSpec{t.name, t.dtype, t.shape});
  }
  return prep::PreparedForTensors(c, tensors, "(prepared in memory)");
}

}  // namespace k3::synth
