// `mltrain init` on each kind of data, `mltrain config example`, and `mltrain completion` run
// through bash itself.
#include "cli_support.hpp"

namespace {

// init on `data`, then a few steps of training from the config it wrote, as it is.
nlohmann::json init_and_train(const fs::path& d, const std::string& data, const std::string& name,
                              const std::string& expect) {
  const fs::path cfg = d / (name + ".yaml");
  const auto i = run("init " + data + " -o " + cfg.string());
  INFO(i.out);
  REQUIRE(i.code == 0);
  CHECK_THAT(i.out, Catch::Contains(expect));
  CHECK_THAT(i.out, Catch::Contains("mltrain train " + cfg.string()));
  CHECK(slurp(cfg).rfind("# Written by `mltrain init ", 0) == 0);
  const auto t = run("train " + cfg.string() + " run.dir=" + (d / "runs").string() +
                     " train.duration=3u train.eval_every=3u checkpoint.every=never"
                     " train.final_eval=sample train.final_eval_samples=64 --jsonl");
  INFO(t.out);
  REQUIRE(t.code == 0);
  const size_t at = t.out.rfind("\"event\":\"summary\"");
  REQUIRE(at != std::string::npos);
  const size_t from = t.out.rfind('{', at);
  return nlohmann::json::parse(t.out.substr(from, t.out.find('\n', at) - from));
}

}  // namespace

TEST_CASE("init: each kind of data gets a config that trains as it is", "[cli][init]") {
  const auto d = tmpdir("init");
  // IDX files in their folder (Fashion-MNIST's own layout).
  auto s = init_and_train(d, kFmnist, "idx", "found IDX/.npy arrays");
  CHECK(s["task"] == "classification");
  CHECK_THAT(slurp(d / "idx.yaml"), Catch::Contains("num_classes: 10"));
  CHECK_THAT(slurp(d / "idx.yaml"), Catch::Contains("name: cnn"));

  // An image folder with train/ and test/ (real Fashion-MNIST PNGs).
  REQUIRE(sh(kPython + " " + kSrc + "/scripts/data/fmnist_images.py --out " + d.string() +
             " --limit 200")
              .code == 0);
  s = init_and_train(d, (d / "fmnist_png").string(), "png", "found image folder");
  CHECK_THAT(slurp(d / "png.yaml"), Catch::Contains("image: {size: 28, mode: gray}"));
  CHECK_THAT(slurp(d / "png.yaml"), Catch::Contains("fmnist_png/test"));

  // A chunk set from that folder: no test split beside it, so 10 % is held out (and said).
  REQUIRE(run("data convert " + (d / "fmnist_png" / "train").string() + " -o " +
              (d / "chunks").string())
              .code == 0);
  s = init_and_train(d, (d / "chunks").string(), "chunks", "found chunk set");
  CHECK_THAT(slurp(d / "chunks.yaml"), Catch::Contains("val_fraction: 0.1"));
  CHECK_THAT(slurp(d / "chunks.yaml"), Catch::Contains("# note: no separate test split"));

  // CSV tables: text labels make a classification, many numbers a regression.
  {
    std::ofstream c(d / "cls.csv"), r(d / "reg.csv");
    c << "a,b,kind\n";
    r << "a,b,price\n";
    for (int i = 0; i < 120; ++i) {
      c << i % 7 << "," << (i * 13) % 11 << "," << (i % 3 ? "cat" : "dog") << "\n";
      r << i % 7 << "," << (i * 13) % 11 << "," << 1.5 * i + 0.25 << "\n";
    }
  }
  s = init_and_train(d, (d / "cls.csv").string(), "cls", "task classification, model mlp");
  CHECK_THAT(slurp(d / "cls.yaml"), Catch::Contains("num_classes: 2"));
  s = init_and_train(d, (d / "reg.csv").string(), "reg", "task regression");
  CHECK(s["task"] == "regression");

  // Token streams from text.
  REQUIRE(run("data tokenize /usr/share/games/fortunes/literature -o " + (d / "tok").string() +
              " --bytes")
              .code == 0);
  s = init_and_train(d, (d / "tok").string(), "tok", "task language_model, model gpt");
  CHECK(s["task"] == "language_model");

  // Refused: an existing output, data that is not there, one file of a kind it cannot tell.
  const auto again = run("init " + kFmnist + " -o " + (d / "idx.yaml").string());
  CHECK(again.code == 2);
  CHECK_THAT(again.out, Catch::Contains("exists"));
  CHECK(run("init " + kFmnist + " -o " + (d / "idx.yaml").string() + " --force").code == 0);
  const auto missing = run("init " + (d / "nope").string());
  CHECK(missing.code == 3);
  const auto one =
      run("init " + kFmnist + "/t10k-images-idx3-ubyte.gz -o " + (d / "x.yaml").string());
  CHECK(one.code == 2);
  CHECK_THAT(one.out, Catch::Contains("the folder holding the images and labels files"));
}

TEST_CASE("config example: lists the shipped configs and writes one as shipped", "[cli][init]") {
  const auto d = tmpdir("config_example");
  const auto list = run("config example");
  INFO(list.out);
  REQUIRE(list.code == 0);
  // One line per config under configs/, with its first comment line.
  CHECK_THAT(list.out, Catch::Contains("fashion_mnist_cnn "));
  CHECK_THAT(list.out, Catch::Contains("The main job: the classic 2-conv CNN"));
  CHECK_THAT(list.out, Catch::Contains("tune/fashion_mnist_mlp "));
  CHECK_THAT(list.out, Catch::Contains("from " + kSrc + "/configs"));

  const fs::path out = d / "cnn.yaml";
  const auto w = run("config example fashion_mnist_cnn -o " + out.string());
  INFO(w.out);
  REQUIRE(w.code == 0);
  CHECK(slurp(out) == slurp(fs::path(kSrc) / "configs" / "fashion_mnist_cnn.yaml"));
  CHECK(run("config check " + out.string()).code == 0);
  // Never overwrites without --force; an unknown name is a usage error listing the names.
  std::ofstream(out) << "mine\n";
  const auto again = run("config example fashion_mnist_cnn -o " + out.string());
  CHECK(again.code == 2);
  CHECK_THAT(again.out, Catch::Contains("exists; not overwritten"));
  CHECK(slurp(out) == "mine\n");
  CHECK(run("config example fashion_mnist_cnn --force -o " + out.string()).code == 0);
  CHECK(slurp(out) == slurp(fs::path(kSrc) / "configs" / "fashion_mnist_cnn.yaml"));
  const auto bad = run("config example nope");
  CHECK(bad.code == 2);
  CHECK_THAT(bad.out, Catch::Contains("no example named 'nope'"));
  CHECK_THAT(bad.out, Catch::Contains("one of: breast_cancer_csv, "));
}

TEST_CASE("completion: bash completes subcommands, flags and config keys", "[cli][completion]") {
  const auto d = tmpdir("completion");
  REQUIRE(sh(kBin + " completion bash > " + (d / "mltrain.bash").string()).code == 0);
  // What bash completes for the words typed so far (COMP_WORDS as bash fills them).
  auto complete = [&](const std::string& words) {
    const auto r = sh("bash -c 'source " + (d / "mltrain.bash").string() +
                      " && complete -p mltrain && COMP_WORDS=(" + words +
                      ") && COMP_CWORD=$((${#COMP_WORDS[@]} - 1)) && _mltrain && echo "
                      "\"[${COMPREPLY[*]}]\"'");
    INFO(words << "\n" << r.out);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.out, Catch::Contains("complete -o filenames -F _mltrain mltrain"));
    return r.out.substr(r.out.rfind('['));
  };
  CHECK(complete("mltrain tr") == "[train track]\n");
  CHECK(complete("mltrain trai") == "[train]\n");
  CHECK(complete("mltrain track p") == "[push]\n");
  CHECK_THAT(complete("mltrain \"\""), Catch::Contains("predict"));
  CHECK(complete("mltrain data con") == "[convert]\n");
  CHECK(complete("mltrain predict run --to") == "[--top-k]\n");
  CHECK(complete("mltrain data convert in --chunk") == "[--chunk-mb]\n");
  CHECK(complete("mltrain train c.yaml optim.l") == "[optim.lr=]\n");
  CHECK_THAT(complete("mltrain train c.yaml schedule.war"), Catch::Contains("schedule.warmup="));
  // zsh: the same function through zsh's bashcompinit.
  const auto z = run("completion zsh");
  CHECK(z.code == 0);
  CHECK_THAT(z.out, Catch::Contains("bashcompinit"));
  CHECK_THAT(z.out, Catch::Contains("complete -o filenames -F _mltrain mltrain"));
  CHECK(run("completion fish").code == 2);
}
