// TensorsOf lives apart from prepared_layout.cpp so code that only validates a prepared
// directory (k3run) does not link the safetensors index.
#include "formats/prepared_layout.h"
#include "formats/safetensors.h"

namespace k3::prep {

std::vector<TensorSpec> TensorsOf(const st::CheckpointIndex& index) {
  std::vector<TensorSpec> out;
  out.reserve(index.tensor_count());
  for (const st::CheckpointIndex::Location& loc : index.All()) {
    out.push_back(TensorSpec{loc.tensor->name, loc.tensor->dtype, loc.tensor->shape});
  }
  return out;
}

}  // namespace k3::prep
