#include <filesystem>
#include <iostream>

#include "commands.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/config/experiment.hpp"
#include "mltrain/data/open.hpp"
#include "mltrain/data/sources.hpp"

namespace mltrain::cli {

namespace {

// The flags of `data convert` as a config's data: section, read by data::convert_data.
template <class Opts>
int convert(const Opts& c) {
  config::DataConfig dc;
  dc.image.size = c.size, dc.image.mode = c.mode, dc.image.resize = c.resize;
  dc.on_bad_sample = c.skip_bad ? "skip" : "error";
  dc.csv.target = c.target, dc.csv.features = c.features, dc.csv.categorical = c.categorical;
  dc.csv.fill = c.fill;
  dc.num_classes = c.num_classes;
  data::ConvertInput in;
  in.input = c.input, in.images = c.images, in.labels = c.labels;
  in.targets = {c.targets == "float" ? data::TargetKind::kFloat : data::TargetKind::kClassId,
                c.num_classes};
  data::ChunkWriteOptions wo;
  wo.chunk_bytes = c.chunk_mb << 20;
  wo.jpeg = c.store == "jpeg";
  wo.quality = c.quality;
  std::cout << data::convert_data(dc, in, c.out, wo).to_text();
  return 0;
}

}  // namespace

static void setup_convert(CLI::App* sub, Action& run) {
  struct ConvertOpts {
    std::string input, images, labels, out, store = "raw", mode = "gray", targets = "class";
    std::string fill = "error";
    std::vector<std::string> target, features, categorical;
    int64_t num_classes = 10, size = 28, resize = 0, chunk_mb = 128;
    int quality = 95;
    bool skip_bad = false;
  };
  auto c = std::make_shared<ConvertOpts>();
  auto* conv = sub->add_subcommand(
      "convert",
      "write a chunk set (a folder: ~128 MB chunks + index.json with SHA-256 per chunk) or a "
      "single .shard from an image folder, a CSV table, or IDX/.npy images + labels");
  conv->add_option("input", c->input,
                   "an image folder (one sub-folder per class) or a .csv table; or use --images");
  conv->add_option("--images", c->images, "IDX (.gz ok) or .npy images");
  conv->add_option("--labels", c->labels, "labels (class ids) or targets file for --images");
  conv->add_option("-o,--output", c->out, "output: a new folder (chunk set), or FILE.shard")
      ->required();
  conv->add_option("--num-classes", c->num_classes, "labels must lie in [0, N)");
  conv->add_option("--store", c->store, "chunk records: raw pixels, or jpeg (decoded on the fly)")
      ->check(CLI::IsMember({"raw", "jpeg"}));
  conv->add_option("--quality", c->quality, "--store jpeg: JPEG quality")
      ->check(CLI::Range(1, 100));
  conv->add_option("--chunk-mb", c->chunk_mb, "MiB per chunk file")->check(CLI::Range(1, 4096));
  conv->add_option("--size", c->size, "image folders: side of the square samples");
  conv->add_option("--mode", c->mode, "image folders: gray or rgb")
      ->check(CLI::IsMember({"gray", "rgb"}));
  conv->add_option("--resize", c->resize, "image folders: shorter side before the centre crop");
  conv->add_flag("--skip-bad", c->skip_bad, "image folders: leave unreadable images out (counted)");
  conv->add_option("--target", c->target, "CSV: target column(s) (default: the last)");
  conv->add_option("--features", c->features, "CSV: feature columns (default: all others)");
  conv->add_option("--categorical", c->categorical, "CSV: text columns mapped to ids");
  conv->add_option("--fill", c->fill, "CSV: missing cells: error, mean, zero or a number");
  conv->add_option("--targets", c->targets, "CSV / --labels: class ids or float values")
      ->check(CLI::IsMember({"class", "float"}));
  conv->callback([&run, c] { run = [c] { return convert(*c); }; });
}

static void setup_verify(CLI::App* sub, Action& run) {
  auto verify_dir = std::make_shared<std::string>();
  auto* ver = sub->add_subcommand("verify", "hash every chunk of a chunk set against index.json");
  ver->add_option("dir", *verify_dir, "chunk set folder")->required();
  ver->callback([&run, verify_dir] {
    run = [verify_dir] {
      data::verify_chunks(*verify_dir);
      std::cout << *verify_dir << ": " << data::chunk_count(*verify_dir)
                << " chunks match index.json\n";
      return 0;
    };
  });
}

static void setup_tokenize(CLI::App* sub, Action& run) {
  struct TokenizeOpts {
    std::vector<std::string> files;
    std::string out;
    bool bytes = false;
    double val_fraction = 0.1;
    data::SentencePieceOptions sp;
  };
  auto t = std::make_shared<TokenizeOpts>();
  auto* tok = sub->add_subcommand(
      "tokenize",
      "text files -> token streams for language models (train.bin, val.bin, meta.json): bytes, "
      "or SentencePiece pieces of a given or freshly trained model");
  tok->add_option("files", t->files, "text files, concatenated in the order given")->required();
  tok->add_option("-o,--output", t->out, "output folder (data.root of a tokens config)")
      ->required();
  auto* bytes = tok->add_flag("--bytes", t->bytes, "byte-level tokens (vocabulary 256)");
  auto* model = tok->add_option("--sentencepiece", t->sp.model,
                                "a SentencePiece .model file (spm_train's, or PyPI "
                                "sentencepiece's): its pieces, each line ending in EOS");
  auto* train = tok->add_option("--train-sentencepiece", t->sp.train_vocab,
                                "train a SentencePiece model of this many pieces on the files "
                                "first (<output>/tokenizer.model), then tokenize with it")
                    ->check(CLI::Range(int64_t{8}, int64_t{1} << 22));
  tok->add_option("--model-type", t->sp.model_type, "--train-sentencepiece: unigram or bpe")
      ->check(CLI::IsMember({"unigram", "bpe"}))
      ->capture_default_str();
  bytes->excludes(model)->excludes(train);
  model->excludes(train);
  tok->add_option("--val-fraction", t->val_fraction, "the stream's last fraction held out")
      ->check(CLI::Range(0.0, 0.5));
  tok->callback([&run, t] {
    run = [t] {
      if (!t->bytes && t->sp.model.empty() && t->sp.train_vocab == 0)
        throw ConfigError("data tokenize", "no tokenizer chosen",
                          "pass --bytes, --sentencepiece MODEL.model or --train-sentencepiece "
                          "VOCAB_SIZE");
      const auto r = t->bytes
                         ? data::tokenize_bytes(t->files, t->out, t->val_fraction)
                         : data::tokenize_sentencepiece(t->files, t->out, t->val_fraction, t->sp);
      std::cout << "wrote " << t->out << "/train.bin (" << r.train_tokens << " tokens), " << t->out
                << "/val.bin (" << r.val_tokens << " tokens), meta.json (vocab " << r.vocab << ", "
                << r.dtype << (r.dtype == "uint32" ? ": over 65,535 pieces do not fit uint16" : "")
                << ")\n";
      return 0;
    };
  });
}

static void setup_inspect(CLI::App* sub, Action& run) {
  struct InspectOpts {
    std::string file, labels;
  };
  auto in = std::make_shared<InspectOpts>();
  auto* insp = sub->add_subcommand(
      "inspect", "print shape, dtype, label counts and pixel statistics of a data file");
  insp->add_option("file", in->file, "IDX, .npy or .shard file, or a chunk set folder")->required();
  insp->add_option("--labels", in->labels, "labels file to pair with images");
  insp->callback([&run, in] {
    run = [in] {
      std::cout << data::inspect_data(in->file, in->labels);
      return 0;
    };
  });
}

void setup_data(CLI::App& app, Action& run) {
  auto* sub = app.add_subcommand("data", "convert and inspect data files");
  sub->require_subcommand(1);

  setup_convert(sub, run);
  setup_verify(sub, run);
  setup_tokenize(sub, run);
  setup_inspect(sub, run);
}

}  // namespace mltrain::cli
