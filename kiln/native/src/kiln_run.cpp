// kiln-run ARTIFACT_DIR INPUTS.safetensors OUTPUTS.safetensors: runs an artifact `kiln.export`
// wrote, on the inputs named as in its metadata, and writes its outputs as output_0, output_1, ...
// No Python: it links libtorch and opens the artifact's library (docs/deploy.md).
#include "kiln_artifact.h"

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: kiln-run ARTIFACT_DIR INPUTS.safetensors OUTPUTS.safetensors\n";
    return 2;
  }
  try {
    kiln::Artifact artifact(argv[1]);
    std::map<std::string, at::Tensor> inputs;
    for (auto& [name, t] : kiln::load_safetensors(argv[2])) inputs[name] = t;
    std::vector<at::Tensor> outputs = artifact.run(inputs);
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (size_t k = 0; k < outputs.size(); ++k) named.emplace_back("output_" + std::to_string(k), outputs[k]);
    kiln::save_safetensors(argv[3], named);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
