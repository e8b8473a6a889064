#pragma once
// The registry's GPT (model.name: gpt), built by build_model.
#include <memory>

#include "mltrain/model/model.hpp"

namespace mltrain::model {

std::unique_ptr<Model> make_gpt(const config::ModelConfig& c, int64_t vocab);

}  // namespace mltrain::model
