#pragma once
// The one mapping from a config's `data:` section to the readers: every command that reads a
// run's data (train, evaluate, predict, profile, tune's trials) goes through here, so the same
// config always reads the same samples the same way.
//
//   data::OpenedData d = data::open_data(cfg, task::target_spec(cfg));   // d.train, d.test
//   data::Inputs in = data::open_inputs(cfg, d, "new_photos/");          // predict's inputs
#include <string>
#include <vector>

#include "mltrain/config/experiment.hpp"
#include "mltrain/data/dataset.hpp"
#include "mltrain/data/sources.hpp"

namespace mltrain::data {

struct OpenedData {
  Dataset train, test;
  std::vector<std::string> class_names;  // image folders' class folders, CSV text labels, else {}
  CsvOptions::Learned csv;               // a CSV's training table: columns, categories, statistics
};
// The training and test data `cfg.data` names (data.dataset, data.format, chunk sets, arrays,
// token streams), targets read as `targets` says. DataError (exit 3) on a missing or bad file.
OpenedData open_data(const config::ExperimentConfig& cfg, const TargetSpec& targets);

FolderOptions folder_options(const config::DataConfig& c);
CsvOptions csv_options(const config::DataConfig& c, const TargetSpec& targets);

// New inputs for a model trained on `trained` (mltrain predict): an image folder (every image in
// it, recursively) or image file, a CSV table with the training table's feature columns, an
// IDX/.npy/.shard array or a chunk set of the training samples' shape. Targets are zero (or the
// chunk set's own); `ids` names each sample: its file, "FILE:ROW" (1-based data row), or
// "FILE:INDEX". Input that does not fit the model is a DataError naming the file and what was
// expected.
struct Inputs {
  Dataset data;
  std::vector<std::string> ids;
};
Inputs open_inputs(const config::ExperimentConfig& cfg, const OpenedData& trained,
                   const std::string& path);

// `mltrain data convert`: an image folder, a CSV table (not standardised: training standardises
// with the training table's statistics) or IDX/.npy `images` + `labels`, read as a config's
// `data:` section `c` says, written as a chunk set (folder `out`) or a single `out`.shard.
struct ConvertInput {
  std::string input, images, labels;  // input: a folder or a .csv; or images (+ labels)
  TargetSpec targets;
};
struct ConvertResult {
  std::string out;
  bool shard = false;
  int64_t samples = 0, chunks = 0, bytes = 0, skipped = 0, sample_elems = 0;
  DType dtype = DType::kU8;
  std::string store = "raw";
  std::string to_text() const;
};
ConvertResult convert_data(const config::DataConfig& c, const ConvertInput& in,
                           const std::string& out, const ChunkWriteOptions& wo);

}  // namespace mltrain::data
