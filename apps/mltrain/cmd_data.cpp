#include <cmath>
#include <iostream>

#include "commands.hpp"
#include "mltrain/data/dataset.hpp"

namespace mltrain::cli {

void setup_data(CLI::App& app, Action& run) {
  auto* sub = app.add_subcommand("data", "convert and inspect data files");
  sub->require_subcommand(1);

  struct ConvertOpts {
    std::string images, labels, out;
    int64_t num_classes = 10;
  };
  auto c = std::make_shared<ConvertOpts>();
  auto* conv = sub->add_subcommand(
      "convert", "write a memory-mapped shard from IDX (.gz ok) or .npy images + labels");
  conv->add_option("--images", c->images, "images file")->required();
  conv->add_option("--labels", c->labels, "labels file")->required();
  conv->add_option("-o,--output", c->out, "output .shard file")->required();
  conv->add_option("--num-classes", c->num_classes, "labels must lie in [0, N)");
  conv->callback([&run, c] {
    run = [c] {
      auto ds = data::load_dataset(c->images, c->labels, c->num_classes);
      data::write_shard(ds, c->out);
      std::cout << "wrote " << c->out << ": " << ds.count << " samples of " << ds.sample_elems()
                << " " << data::dtype_name(ds.dtype) << "\n";
      return 0;
    };
  });

  struct TokenizeOpts {
    std::vector<std::string> files;
    std::string out;
    bool bytes = false;
    double val_fraction = 0.1;
  };
  auto t = std::make_shared<TokenizeOpts>();
  auto* tok = sub->add_subcommand(
      "tokenize",
      "text files -> token streams for language models (train.bin, val.bin, meta.json)");
  tok->add_option("files", t->files, "text files, concatenated in the order given")->required();
  tok->add_option("-o,--output", t->out, "output folder (data.root of a tokens config)")
      ->required();
  tok->add_flag("--bytes", t->bytes,
                "byte-level tokens (vocabulary 256): the only tokenizer built in")
      ->required();
  tok->add_option("--val-fraction", t->val_fraction, "the stream's last fraction held out")
      ->check(CLI::Range(0.0, 0.5));
  tok->callback([&run, t] {
    run = [t] {
      const auto r = data::tokenize_bytes(t->files, t->out, t->val_fraction);
      std::cout << "wrote " << t->out << "/train.bin (" << r.train_tokens << " tokens), " << t->out
                << "/val.bin (" << r.val_tokens << " tokens), meta.json (vocab 256)\n";
      return 0;
    };
  });

  struct InspectOpts {
    std::string file, labels;
    int64_t num_classes = 1 << 30;
  };
  auto in = std::make_shared<InspectOpts>();
  auto* insp = sub->add_subcommand(
      "inspect", "print shape, dtype, label counts and pixel statistics of a data file");
  insp->add_option("file", in->file, "IDX, .npy or .shard file")->required();
  insp->add_option("--labels", in->labels, "labels file to pair with images");
  insp->callback([&run, in] {
    run = [in] {
      if (!data::is_shard(in->file) && in->labels.empty()) {
        auto a = data::read_array(in->file);
        std::cout << in->file << ": " << data::dtype_name(a.dtype) << " " << a.shape_text() << "\n";
        return 0;
      }
      auto ds = data::load_dataset(in->file, in->labels, in->num_classes);
      std::cout << in->file << ": " << (data::is_shard(in->file) ? "shard" : "array") << ", "
                << ds.count << " samples, dtype " << data::dtype_name(ds.dtype)
                << ", sample shape [";
      for (size_t i = 0; i < ds.sample_shape.size(); ++i)
        std::cout << (i ? "," : "") << ds.sample_shape[i];
      std::cout << "]\n";
      std::map<int64_t, int64_t> hist;
      for (int64_t i = 0; i < ds.count; ++i) hist[ds.label(i)]++;
      std::cout << "labels:";
      for (auto& [k, v] : hist) std::cout << " " << k << ":" << v;
      std::cout << "\n";
      if (ds.dtype == data::DType::kU8 && ds.count > 0) {
        double s = 0, s2 = 0;
        const int64_t n = ds.count * ds.sample_elems();
        for (int64_t i = 0; i < n; ++i) {
          double v = ds.data[i] / 255.0;
          s += v;
          s2 += v * v;
        }
        const double mean = s / n;
        std::cout << "pixels/255: mean " << mean << " std " << std::sqrt(s2 / n - mean * mean)
                  << "\n";
      }
      return 0;
    };
  });
}

}  // namespace mltrain::cli
