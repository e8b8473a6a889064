#pragma once
// `mltrain init DATA_PATH`: looks at the data, picks the task and a model that fits, and writes a
// commented config that trains as it is.
//
//   auto r = init::init_config({.data = "pets/", .out = "pets.yaml"});
//   std::cout << r.to_text();   // what it found and the command that trains it
#include <string>
#include <vector>

namespace mltrain::init {

struct InitOptions {
  std::string data;  // an image folder, a .csv, a token folder or file, IDX/.npy files, a chunk set
  std::string out = "config.yaml";
  bool force = false;  // overwrite an existing file
  std::string model;   // a torch.export .pt2 to train instead of the proposed model (exported)
};

struct InitReport {
  std::string kind;   // "image folder", "CSV table", "token stream", "IDX/.npy arrays", "chunk set"
  std::string task;   // classification, regression, language_model
  std::string model;  // cnn, mlp, gpt, exported
  std::string train, test;         // the files or folders the config reads
  std::vector<std::string> notes;  // guesses the user should check
  std::string out, yaml;
  std::string to_text() const;
};
// DataError (exit 3) when the data or the .pt2 cannot be read; ConfigError (exit 2) when its kind
// is unknown or the output exists.
InitReport init_config(const InitOptions& opt);

}  // namespace mltrain::init
