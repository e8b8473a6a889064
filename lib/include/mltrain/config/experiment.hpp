#pragma once
// The whole experiment config. Each setting is declared once, here, with its default, doc line
// and check; `mltrain config schema` prints this table, `--print-config` the resolved values.
//
// Precedence (lowest to highest): these defaults < the YAML file < key.path=value overrides on
// the command line < dedicated flags (e.g. `--run-name`, `--threads`).
//
//   auto cfg = mltrain::config::load_experiment("configs/fashion_mnist_cnn.yaml", {"optim.lr=0.01"});
#include <cmath>
#include <string>
#include <vector>

#include "mltrain/config/schema.hpp"

namespace mltrain::config {

// What the model learns: the loss on its outputs and the metrics reported on the held-out split
// (names: task_metrics()). Targets: class ids (classification), float arrays of any per-sample
// shape (regression), 0/1 arrays [N, num_classes] (multilabel), token streams (language_model).
struct TaskConfig {
  std::string name = "classification";
  std::string loss = "mse";
  double huber_delta = 1.0;
  std::vector<double> pos_weight;
  double threshold = 0.5;
  int64_t top_k = 5;
  int64_t ignore_index = -100;
  template <class V>
  void visit(V& v) {
    v.field("name", name,
            "classification (cross-entropy) | regression | multilabel (BCE with logits) | "
            "language_model (next-token cross-entropy) | custom (a TorchScript model whose "
            "forward(inputs, targets) returns the loss, or a dict with loss and named metrics)",
            one_of({"classification", "regression", "multilabel", "language_model", "custom"}));
    v.field("loss", loss, "regression: mse | l1 | huber", one_of({"mse", "l1", "huber"}));
    v.field("huber_delta", huber_delta, "regression, huber: where the loss turns linear",
            positive<double>());
    v.field("pos_weight", pos_weight,
            "multilabel: weight of the positive term per class (empty: 1 for every class)");
    v.field("threshold", threshold,
            "multilabel: sigmoid probability at or above which a label is "
            "predicted (F1)",
            in_range(0.0, 1.0));
    v.field("top_k", top_k, "classification: also report top-k accuracy (0 or 1: off)",
            non_negative<int64_t>());
    v.field("ignore_index", ignore_index,
            "language_model: target token id that counts neither in the loss nor the metrics");
  }
};

struct RunConfig {
  std::string name = "";  // empty: the config file's stem
  std::string dir = "runs";
  int64_t seed = 0;
  template <class V>
  void visit(V& v) {
    v.field("name", name, "run name; the run lives in <dir>/<name>/v<N> (empty: config file stem)");
    v.field("dir", dir, "root folder for runs");
    v.field("seed", seed, "seed for init, shuffling and dropout", non_negative<int64_t>());
  }
};

struct RuntimeConfig {
  Count threads = Count::automatic();
  std::string kernel_route = "onednn";
  std::string allocator = "retain";
  std::string device = "auto";
  bool cudnn_benchmark = true;
  std::string memory_budget = "none";
  template <class V>
  void visit(V& v) {
    v.field("memory_budget", memory_budget,
            "tensor memory a training step may reach (512MiB, 2GiB, 1.5GB; none: no limit, or on "
            "CUDA the device's memory when data.batch_size is auto); on the CPU it is enforced "
            "by a counting allocator, so running out there behaves as on a GPU",
            memory_size());
    v.field("device", device,
            "where the model trains: auto (cuda when this build and machine have it, else cpu) | "
            "cpu | cuda",
            one_of({"auto", "cpu", "cuda"}));
    v.field("cudnn_benchmark", cudnn_benchmark,
            "CUDA: let cuDNN time its algorithms per input shape (fast when shapes are fixed, as "
            "with drop_last)");
    v.field("threads", threads, "intra-op threads (auto: all usable cores)");
    v.field("kernel_route", kernel_route,
            "kernel for fp32 Linear/matmul on the CPU: oneDNN's sgemm (Debian's libdnnl) or "
            "LibTorch's own (MKL)",
            one_of({"onednn", "native"}));
    v.field("allocator", allocator,
            "retain: keep freed memory (no page faults per step); system: glibc defaults",
            one_of({"retain", "system"}));
  }
};

// One augmentation: probability, strength and the part of training it is active in.
struct AugOpConfig {
  double p = 0.0;
  std::vector<double> window = {0.0, 1.0};
  template <class V>
  void visit(V& v) {
    v.field("p", p, "probability per sample (mixup/cutmix: per batch); 0 = off",
            in_range(0.0, 1.0));
    v.field("window", window,
            "[start, end] as fractions of training, e.g. [0.7, 1.0] = only the last 30%");
  }
};

struct AugmentConfig {
  AugOpConfig crop, flip, rotate, color, grayscale, erase, mixup, cutmix;
  std::vector<double> crop_scale = {0.7, 1.0}, crop_ratio = {0.75, 1.3333333333333333};
  double rotate_degrees = 10.0;
  double brightness = 0.2, contrast = 0.2, saturation = 0.0, hue = 0.0;
  std::vector<double> erase_scale = {0.02, 0.2};
  double mix_alpha = 0.2;
  std::string curriculum = "none";
  bool adaptive = false;
  std::string adaptive_rule = "gap";
  double adaptive_gap = 0.02, adaptive_step = 0.1;
  template <class V>
  void visit(V& v) {
    v.section(
        "crop", crop,
        "random resized crop (scale and aspect-ratio ranges), bilinear, back to the input size");
    v.field("crop_scale", crop_scale, "crop: area fraction range");
    v.field("crop_ratio", crop_ratio, "crop: aspect ratio range (log-uniform)");
    v.section("flip", flip, "horizontal flip");
    v.section("rotate", rotate, "rotation by up to rotate_degrees, bilinear, background fill");
    v.field("rotate_degrees", rotate_degrees, "rotate: largest angle", in_range(0.0, 180.0));
    v.section("color", color, "brightness, contrast, saturation and hue jitter");
    v.field("brightness", brightness, "color: largest brightness shift (pixel units, [0,1] scale)",
            in_range(0.0, 1.0));
    v.field("contrast", contrast, "color: largest relative contrast change", in_range(0.0, 1.0));
    v.field("saturation", saturation,
            "color: largest relative saturation change (RGB images; blends with the luma image)",
            in_range(0.0, 1.0));
    v.field("hue", hue, "color: largest hue rotation as a fraction of the colour wheel (RGB)",
            in_range(0.0, 0.5));
    v.section("grayscale", grayscale,
              "replace an RGB image by its luma in all three channels (RandomGrayscale)");
    v.section("erase", erase, "random erasing / cutout of one rectangle");
    v.field("erase_scale", erase_scale, "erase: area fraction range");
    v.section("mixup", mixup, "mixup of whole batches (Zhang et al. 2018)");
    v.section("cutmix", cutmix, "cutmix of whole batches (Yun et al. 2019)");
    v.field("mix_alpha", mix_alpha, "mixup/cutmix: Beta(alpha, alpha) mixing weight",
            positive<double>());
    v.field("curriculum", curriculum,
            "three_phase (the field guide's): geometric ops (crop, flip, rotate) from the start, "
            "colour and grayscale from 1/3 of training, mixup and cutmix from 2/3 (their windows; "
            "each op still needs its p); none: the windows as written",
            one_of({"none", "three_phase"}));
    v.field("adaptive", adaptive,
            "scale magnitudes by a strength that follows the train/eval accuracy gap");
    v.field("adaptive_rule", adaptive_rule,
            "adaptive: gap (strength +- adaptive_step by the train/eval accuracy gap) | guide "
            "(the field guide's as written: from strength 0.1, x 0.9 when the validation loss "
            "beat the best so far, else x 1.1, at most 0.5) | guide_accuracy (an earlier "
            "reading: from 0.5, eval accuracy against the previous evaluation)",
            one_of({"gap", "guide", "guide_accuracy"}));
    v.field("adaptive_gap", adaptive_gap,
            "adaptive: raise strength while train acc - eval acc exceeds this",
            non_negative<double>());
    v.field("adaptive_step", adaptive_step, "adaptive: strength change per evaluation",
            in_range(0.0, 1.0));
  }
};

// Decoding of image folders and JPEG chunk records.
struct ImageConfig {
  int64_t size = 28;
  std::string mode = "gray";
  int64_t resize = 0;
  std::string cache = "none";
  template <class V>
  void visit(V& v) {
    v.field("size", size, "side of the square samples (after resize and centre crop)",
            positive<int64_t>());
    v.field("mode", mode, "gray (1 channel, ITU-R 601 luma) or rgb (3 channels)",
            one_of({"gray", "rgb"}));
    v.field("resize", resize,
            "scale the shorter side to this before the centre crop (0: to size), as "
            "torchvision's Resize + CenterCrop",
            non_negative<int64_t>());
    v.field("cache", cache,
            "none: decode each image every epoch in the loader; memory: decode every image once "
            "at load, on every core, and keep the decoded samples in memory (count x channels x "
            "size^2 bytes; the loader then spends no CPU on decoding)",
            one_of({"none", "memory"}));
  }
};

struct CsvConfig {
  bool header = true;
  std::string delimiter = ",";
  std::vector<std::string> features;
  std::vector<std::string> target;
  std::vector<std::string> categorical;
  std::string fill = "error";
  bool standardize = true;
  template <class V>
  void visit(V& v) {
    v.field("header", header, "the first row names the columns");
    v.field("delimiter", delimiter, "one character, e.g. ',' ';' or '\\t'");
    v.field("features", features,
            "feature columns by name or 0-based index (empty: all but target)");
    v.field("target", target,
            "target column(s) by name or index (empty: the last column); regression may list "
            "several, multilabel one 0/1 column per class");
    v.field("categorical", categorical,
            "text columns mapped to ids (the training table's sorted distinct values)");
    v.field("fill", fill,
            "missing cells (empty, NA, NaN, null): error, mean (the training column's), zero, or "
            "a number");
    v.field("standardize", standardize,
            "features to zero mean and unit variance with the training table's statistics");
  }
};

// Which training samples an epoch draws. weighted: as many draws as samples, with replacement,
// sample i with probability proportional to its class's weight (PyTorch's WeightedRandomSampler
// with num_samples = the set's size), a pure function of (seed, epoch), shared by the ranks as a
// shuffle is, so a run resumes bitwise and an elastic one changes no draw.
struct SamplerConfig {
  std::string name = "uniform";
  std::vector<double> class_weights;
  std::vector<double> oversample;
  template <class V>
  void visit(V& v) {
    v.field("name", name, "uniform (each sample once an epoch) | weighted (draws by class)",
            one_of({"uniform", "weighted"}));
    v.field("class_weights", class_weights,
            "weighted: one weight >= 0 per class (data.num_classes of them)");
    v.field("oversample", oversample,
            "weighted: [class, k]: that class drawn k times as often as the others (weight k, "
            "the rest 1); instead of class_weights");
  }
};

struct DataConfig {
  std::string dataset = "fashion_mnist";
  std::string format = "auto";
  std::string root = "/usr/share/datasets/fashion-mnist";
  std::string train_images = "", train_labels = "", test_images = "", test_labels = "";
  int64_t num_classes = 10;
  int64_t vocab_size = 0;
  int64_t limit_train = 0;
  double val_fraction = 0.0;
  int64_t folds = 0, fold = 0, fold_seed = 0;
  AutoSize batch_size = 128;
  Count eval_batch_size = Count::automatic();
  Count workers = Count::automatic();
  int64_t prefetch = 4;
  bool shuffle = true;
  SamplerConfig sampler;
  bool drop_last = true;
  bool pin_memory = true;
  double mean = 0.2860;  // Fashion-MNIST training-set pixel mean / std, in [0, 1] units
  double std = 0.3530;
  ImageConfig image;
  CsvConfig csv;
  std::string on_bad_sample = "error";
  int64_t shuffle_window = 4;
  int64_t memory_budget_mb = 0;
  AugmentConfig augment;
  template <class V>
  void visit(V& v) {
    v.field("dataset", dataset,
            "fashion_mnist (files under root), files (the four paths below) or tokens (a token "
            "stream: root/train.bin and root/val.bin from `mltrain data tokenize`, or "
            "train_images/test_images as .bin or .npy)",
            one_of({"fashion_mnist", "files", "tokens"}));
    v.field("root", root, "folder holding the fashion_mnist IDX files, or the tokens' train/val");
    v.field("format", format,
            "dataset files: auto (IDX, .npy, .shard or a chunk set, by content), image_folder "
            "(train_images/test_images are folders with one sub-folder per class) or csv",
            one_of({"auto", "image_folder", "csv"}));
    v.field("vocab_size", vocab_size,
            "tokens: vocabulary (0: meta.json's vocab_size beside the tokens, else the largest id "
            "+ 1); every token must lie below it",
            non_negative<int64_t>());
    v.field("train_images", train_images,
            "training images: IDX (.gz ok), .npy or .shard (dataset: files)");
    v.field("train_labels", train_labels,
            "training labels (unused for .shard, which holds labels)");
    v.field("test_images", test_images, "test images (dataset: files)");
    v.field("test_labels", test_labels, "test labels");
    v.field("num_classes", num_classes, "labels must lie in [0, num_classes)", positive<int64_t>());
    v.field("limit_train", limit_train, "use only the first N training samples (0: all)",
            non_negative<int64_t>());
    v.field("val_fraction", val_fraction,
            "hold out this fraction of training samples for validation", in_range(0.0, 0.5));
    v.field("folds", folds,
            "k-fold cross-validation: evaluate on fold `fold` of this many (a seeded permutation "
            "of the training samples), train on the rest (0: off; `mltrain tune` sets it from "
            "objective.folds)",
            fold_count());
    v.field("fold", fold, "the held-out fold, in [0, folds)", non_negative<int64_t>());
    v.field("fold_seed", fold_seed, "seed of the fold permutation (a study's seed)",
            non_negative<int64_t>());
    v.field("batch_size", batch_size,
            "samples per loader batch (per rank); auto: train.global_batch / world, split into "
            "the largest micro-batches (memory.micro_batch) that fit runtime.memory_budget",
            positive_size_or_auto());
    v.field("eval_batch_size", eval_batch_size,
            "samples per evaluation batch (auto: batch_size, so evaluation never needs more "
            "memory than a training step; on CPU no slower than larger batches)",
            positive_or_auto());
    v.field("workers", workers,
            "loader threads (auto: from cores; 0: load on the training thread)");
    v.field("prefetch", prefetch, "batches prepared ahead (bounded queue)", positive<int64_t>());
    v.field("shuffle", shuffle, "seeded shuffle, a pure function of (seed, epoch, rank, world)");
    v.section("sampler", sampler, "training samples drawn per epoch: uniform or by class weight");
    v.field("drop_last", drop_last, "drop the last incomplete training batch");
    v.field("pin_memory", pin_memory,
            "CUDA: batches in page-locked memory, copied to the GPU asynchronously");
    v.field("mean", mean, "normalisation mean (pixels scaled to [0,1] first)");
    v.field("std", std, "normalisation std", positive<double>());
    v.section("image", image, "image folders and JPEG chunk sets: decoded size and colour mode");
    v.section("csv", csv, "CSV tables (format: csv)");
    v.field("on_bad_sample", on_bad_sample,
            "a corrupt image or unreadable record: error (exit 3 naming it) or skip (image "
            "folders: every image decoded once at load, bad ones left out and counted)",
            one_of({"error", "skip"}));
    v.field("shuffle_window", shuffle_window,
            "chunk sets: chunks shuffled together (the global chunk order is shuffled too)",
            positive<int64_t>());
    v.field(
        "memory_budget_mb", memory_budget_mb,
        "chunk sets: most MiB of chunks mapped at once (0: 2 x shuffle_window + workers chunks)",
        non_negative<int64_t>());
    v.section("augment", augment, "augmentation in the loader workers (training split only)");
  }
};

struct ModelConfig {
  std::string name = "cnn";
  std::vector<int64_t> hidden = {512, 256};
  std::vector<int64_t> channels = {32, 64};
  int64_t fc = 256;
  std::vector<int64_t> widths = {32, 64, 128};
  std::vector<int64_t> depths = {2, 2, 2};
  bool batchnorm = true;
  bool channels_last = true;
  double dropout = 0.25;
  std::string init = "default";
  std::string path = "";
  std::string script_executor = "legacy";
  std::string script_kernels = "mltrain";
  bool fused_batchnorm = true;
  bool conv1x1_as_linear = true;
  std::string output = "";
  int64_t n_layer = 4, n_head = 4, n_embd = 128, block_size = 128;
  bool bias = true;
  double embedding_noise = 0.0;
  std::string share = "none";
  std::string init_from = "";
  bool init_strict = true;
  std::vector<std::string> init_prefix_map;
  template <class V>
  void visit(V& v) {
    v.field("name", name,
            "architecture: a built-in one, a TorchScript file (legacy), or exported: a "
            "torch.export program (.pt2) at model.path",
            one_of({"mlp", "cnn", "resnet", "gpt", "torchscript", "exported"}));
    v.field("output", output,
            "exported: the output the task trains on, by its name in the program's outputs "
            "('logits' of a transformers ModelOutput, '0' of a tuple); empty: the only tensor "
            "output, else 'logits'");
    v.field("n_layer", n_layer, "gpt: transformer blocks", positive<int64_t>());
    v.field("n_head", n_head, "gpt: attention heads (must divide n_embd)", positive<int64_t>());
    v.field("n_embd", n_embd, "gpt: embedding width", positive<int64_t>());
    v.field("block_size", block_size,
            "gpt: context length; language-model windows (data.dataset: tokens) are this long",
            positive<int64_t>());
    v.field("bias", bias, "gpt: biases in Linear and LayerNorm layers");
    v.field("embedding_noise", embedding_noise,
            "gpt: std of Gaussian noise added to the token embeddings in training (not in "
            "evaluation); 0: none",
            non_negative<double>());
    v.field("share", share,
            "gpt: none, gated or gated_input (the field guide's SmartShare): each block's four "
            "weight matrices are one base weight per shape shared by every block, scaled by a "
            "sigmoid gate per block and matrix; gated: a learned scalar; gated_input (the "
            "guide's rule): sigmoid(Linear(mean of the inputs up to each position))[block], "
            "so the gate depends on the input. Biases and norms stay per block",
            one_of({"none", "gated", "gated_input"}));
    v.field("init_from", init_from,
            "start from these weights: an mltrain run or checkpoint folder, a .safetensors file, "
            "or a PyTorch torch.save(model.state_dict()) file (empty: fresh init)");
    v.field("init_strict", init_strict,
            "init_from: every model tensor must be found with its shape (false: load what fits, "
            "report missing, unexpected and mismatched keys by name)");
    v.field("init_prefix_map", init_prefix_map,
            "init_from: key renames 'from=to' applied to the file's key prefixes first (e.g. "
            "'module.=' strips DataParallel's prefix)");
    v.field("hidden", hidden, "mlp: hidden layer widths", each_positive());
    v.field("channels", channels, "cnn: channels of its two 5x5 conv layers", each_positive());
    v.field("fc", fc, "cnn: width of the hidden fully connected layer", positive<int64_t>());
    v.field("widths", widths, "resnet: channels per stage", each_positive());
    v.field("depths", depths, "resnet: basic blocks per stage", each_positive());
    v.field("batchnorm", batchnorm,
            "BatchNorm after each conv/hidden layer (false: biased layers instead; what `mltrain "
            "fuse` writes)");
    v.field(
        "channels_last", channels_last,
        "cnn/resnet/torchscript: NHWC activations and 4-D weights (oneDNN convolutions skip layout "
        "reorders)");
    v.field("dropout", dropout,
            "dropout before the classifier (gpt: on embeddings, attention weights and residual "
            "branches)",
            in_range(0.0, 0.95));
    v.field("init", init,
            "weight init (matrices and kernels; biases zero). layer_adaptive_uniform: U(-a, a), "
            "a = sqrt(3 / (fan_in sqrt(fan_out))); lecun_normal: N(0, 1 / fan_in) (the field "
            "guide's two)",
            one_of({"default", "kaiming_normal", "kaiming_uniform", "xavier_normal",
                    "xavier_uniform", "orthogonal", "layer_adaptive_uniform", "lecun_normal"}));
    v.field("path", path,
            "exported: the .pt2 file (torch.export.save of torch.export.export(model.train(), "
            "...)); torchscript: the .pt file (torch.jit.save) to train");
    v.field("script_executor", script_executor,
            "torchscript: TorchScript's graph executor. legacy: autodiff without profiling runs "
            "(on CPU ~75 MiB less peak memory than profiling at the same speed); profiling: "
            "profiles shapes first, then fuses (worth trying on CUDA)",
            one_of({"legacy", "profiling"}));
    v.field("script_kernels", script_kernels,
            "torchscript and exported: mltrain: dropout and 'ReLU, 2 x 2 max-pool' in the graph "
            "run on mltrain's fused kernels (pytorch/examples' CNN 1.3-1.4x; the pool exact, "
            "dropout draws its own mask); aten: the graph's operators as saved",
            one_of({"mltrain", "aten"}));
    v.field("fused_batchnorm", fused_batchnorm,
            "exported, with script_kernels mltrain: 'batch_norm, [add,] relu' and 'batch_norm, "
            "hardswish' run as one fused operator each (values within float rounding of ATen's, "
            "not bit for bit); false: ATen's operators");
    v.field("conv1x1_as_linear", conv1x1_as_linear,
            "exported, with script_kernels mltrain: a 1 x 1 convolution on a 1 x 1 input "
            "(squeeze-and-excitation blocks) runs as linear, one GEMM (values within float "
            "rounding of ATen's); false: ATen's conv2d");
  }
};

struct ParamGroupConfig {
  std::string pattern = "*";
  double lr_mult = 1.0;
  double weight_decay = -1.0;
  bool freeze = false;
  template <class V>
  void visit(V& v) {
    v.field("pattern", pattern, "glob over parameter names (e.g. *.bias, fc*.weight)");
    v.field("freeze", freeze,
            "these parameters do not train: no gradient, no optimizer state (fine-tuning)");
    v.field("lr_mult", lr_mult, "multiplies the learning rate", non_negative<double>());
    v.field("weight_decay", weight_decay, "weight decay for this group (-1: optim.weight_decay)");
  }
};

struct OptimConfig {
  std::string name = "adam";
  double lr = 1e-3;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 0.0;
  int64_t momentum_reference_batch = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  int64_t freeze_step = 100;
  std::vector<ParamGroupConfig> param_groups;
  template <class V>
  void visit(V& v) {
    v.field("name", name, "optimizer (onebit_adam: 1-bit Adam for data-parallel runs)",
            one_of({"sgd", "adam", "adamw", "onebit_adam"}));
    v.field("lr", lr, "base learning rate", positive<double>());
    v.field("momentum", momentum, "sgd: momentum (0: none)", in_range(0.0, 1.0));
    v.field("nesterov", nesterov, "sgd: Nesterov momentum");
    v.field("momentum_reference_batch", momentum_reference_batch,
            "sgd: momentum compensation for the batch (the field guide's momentum x sqrt(B/ref), "
            "done so it stays below 1): momentum 1 - (1 - m) sqrt(ref / B) for a global batch B, "
            "the heavy-ball effective step lr / (1 - m) scaled by sqrt(B / ref); 0: off",
            non_negative<int64_t>());
    v.field("weight_decay", weight_decay, "L2 (sgd, adam) or decoupled (adamw) weight decay",
            non_negative<double>());
    v.field("beta1", beta1, "adam/adamw: first-moment decay", in_range(0.0, 0.999999));
    v.field("beta2", beta2, "adam/adamw: second-moment decay", in_range(0.0, 0.999999));
    v.field("eps", eps, "adam/adamw: denominator epsilon", positive<double>());
    v.field("freeze_step", freeze_step,
            "onebit_adam: exact Adam steps before the variance freezes and momenta go 1-bit",
            non_negative<int64_t>());
    v.list("param_groups", param_groups,
           "per-parameter-group overrides; the first matching pattern wins");
  }
};

// Learning-rate schedule over train.duration; every one is a pure function of the step
// (plateau: plus its recorded evaluations). Names and parameters follow torch.optim.lr_scheduler.
struct ScheduleConfig {
  std::string name = "constant";
  Period warmup = Period::never();
  double warmup_start = 0.0;
  double gamma = 0.1;
  Period step_size = Period::epochs(1);
  std::vector<Period> milestones;
  double eta_min = 0.0;
  Period t0 = Period::epochs(1);
  int64_t t_mult = 1;
  double pct_start = 0.3, div_factor = 25.0, final_div_factor = 1e4;
  std::string anneal = "cos";
  std::string monitor = "eval_loss";
  std::string mode = "min";
  int64_t patience = 10;
  double threshold = 1e-4;
  int64_t cooldown = 0;
  double min_lr = 0.0;
  Period step_size_down = Period::never();
  std::string cyclic_mode = "triangular";
  double power = 1.0;
  double gn_beta = 0.98;
  Period gn_reference = Period::steps(100);
  double gn_min_factor = 0.1;
  double autolr_target = 0.0;
  bool plateau = false;
  // Whether evaluations steer the LR: the plateau schedule, or any schedule with plateau: true.
  bool on_plateau() const { return name == "plateau" || plateau; }
  template <class V>
  void visit(V& v) {
    v.field("name", name, "schedule",
            one_of({"constant", "step", "multistep", "exponential", "cosine", "cosine_restarts",
                    "onecycle", "plateau", "gradnorm", "autolr", "cyclic", "polynomial"}));
    v.field("warmup", warmup, "linear warm-up in front of any schedule (never, 500u, 1ep)");
    v.field("warmup_start", warmup_start, "warm-up starts at this fraction of the LR",
            in_range(0.0, 1.0));
    v.field("gamma", gamma,
            "step/multistep: factor per drop; exponential: factor per step; plateau: factor",
            in_range(0.0, 1.0));
    v.field("step_size", step_size, "step: drop every period; cyclic: rising half-cycle",
            period_enabled());
    v.field("milestones", milestones, "multistep: drop at these periods (after warm-up)");
    v.field("eta_min", eta_min,
            "cosine, cosine_restarts: the lowest LR; cyclic: the base of each cycle (optim.lr is "
            "the peak)",
            non_negative<double>());
    v.field("t0", t0, "cosine_restarts: length of the first cycle", period_enabled());
    v.field("t_mult", t_mult, "cosine_restarts: each cycle is t_mult times longer",
            positive<int64_t>());
    v.field("pct_start", pct_start, "onecycle: share of steps spent rising to the LR",
            in_range(0.0, 1.0));
    v.field("div_factor", div_factor, "onecycle: initial LR = lr / div_factor", positive<double>());
    v.field("final_div_factor", final_div_factor, "onecycle: final LR = initial / final_div_factor",
            positive<double>());
    v.field("anneal", anneal, "onecycle: annealing shape", one_of({"cos", "linear"}));
    v.field("monitor", monitor,
            "plateau: metric watched at each evaluation (any of the task's metrics; `mltrain "
            "config metrics` lists them)");
    v.field("mode", mode, "plateau: whether the metric should go down or up",
            one_of({"min", "max"}));
    v.field("plateau", plateau,
            "also reduce on plateau on top of this schedule (e.g. warm-up + cosine + plateau, "
            "the field guide's combination): the LR is the schedule's times the factor a plateau "
            "schedule with the same monitor, mode, patience, threshold, cooldown and gamma has "
            "reached (min_lr bounds base LR x factor)");
    v.field("patience", patience, "plateau: evaluations without improvement before a drop",
            non_negative<int64_t>());
    v.field("threshold", threshold, "plateau: relative improvement that counts",
            non_negative<double>());
    v.field("cooldown", cooldown, "plateau: evaluations to wait after a drop",
            non_negative<int64_t>());
    v.field("min_lr", min_lr, "plateau: lower bound", non_negative<double>());
    v.field("step_size_down", step_size_down,
            "cyclic: falling half-cycle (never: same as step_size)");
    v.field("cyclic_mode", cyclic_mode,
            "cyclic: triangular | triangular2 (halve each cycle) | exp_range (gamma^step)",
            one_of({"triangular", "triangular2", "exp_range"}));
    v.field("power", power, "polynomial: lr * (1 - t/T)^power over the schedule",
            positive<double>());
    v.field("gn_beta", gn_beta, "gradnorm: smoothing of the gradient-norm average",
            in_range(0.0, 0.9999));
    v.field("gn_reference", gn_reference,
            "gradnorm: the mean norm over this first period is the reference", period_enabled());
    v.field("gn_min_factor", gn_min_factor,
            "gradnorm, autolr: the LR never falls below this fraction", in_range(0.0, 1.0));
    v.field("autolr_target", autolr_target,
            "autolr (the field guide's AutoLR): lr x clamp(1 - 0.1 x norm / target, "
            "gn_min_factor, 1), norm the gradnorm average (gn_beta); 0: the target is the mean "
            "norm over gn_reference",
            non_negative<double>());
  }
};

struct AmpConfig {
  bool enabled = false;
  std::string dtype = "bf16";
  double init_scale = 65536.0, growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double min_scale = 1.0;
  std::vector<std::string> fp32_modules;
  double underflow_warn = 0.01;
  template <class V>
  void visit(V& v) {
    v.field("enabled", enabled,
            "autocast the forward pass to dtype (the loss and optimizer stay fp32)");
    v.field("dtype", dtype,
            "bf16 (CPU with AVX-512 BF16, or CUDA) or fp16 (CUDA; uses the loss scaler)",
            one_of({"bf16", "fp16"}));
    v.field("init_scale", init_scale, "fp16 loss scaler: first scale", positive<double>());
    v.field("growth_factor", growth_factor,
            "fp16 loss scaler: multiply after growth_interval clean steps", positive<double>());
    v.field("backoff_factor", backoff_factor, "fp16 loss scaler: multiply on inf/nan",
            in_range(0.0, 1.0));
    v.field("growth_interval", growth_interval, "fp16 loss scaler: clean steps before growing",
            positive<int64_t>());
    v.field("min_scale", min_scale,
            "fp16 loss scaler: never below this (PyTorch's GradScaler has no floor)",
            positive<double>());
    v.field("fp32_modules", fp32_modules,
            "fp32 islands: glob patterns over module names (h.*.ln_*, head) that run with "
            "autocast off and their inputs cast to fp32; `mltrain config check` lists the names");
    v.field("underflow_warn", underflow_warn,
            "fp16: warn (and record grad_underflow in metrics) when more than this share of "
            "sampled gradient elements underflow at the current scale",
            in_range(0.0, 1.0));
  }
};

struct ClipConfig {
  std::string mode = "none";
  double max_norm = 1.0;
  double value = 1.0;
  double percentile = 10.0;
  double element_percentile = 99.0;
  int64_t window = 1000;
  int64_t warmup = 100;
  template <class V>
  void visit(V& v) {
    v.field("mode", mode,
            "none | norm (global L2) | value (elementwise) | adaptive (AutoClip percentile) | "
            "element_percentile (each element at a percentile of this step's |g|)",
            one_of({"none", "norm", "value", "adaptive", "element_percentile"}));
    v.field("max_norm", max_norm, "norm: largest global gradient L2 norm", positive<double>());
    v.field("value", value, "value: clamp every gradient element to [-value, value]",
            positive<double>());
    v.field("percentile", percentile, "adaptive: clip at this percentile of recent norms",
            in_range(0.0, 100.0));
    v.field("element_percentile", element_percentile,
            "element_percentile: clamp every gradient element to +-(this percentile of all "
            "elements' |g| at the step; numpy's linear interpolation); 100: no clipping",
            Check<double>{"in (0, 100]", [](const double& p) {
                            return p > 0 && p <= 100 ? "" : "must be in (0, 100]";
                          }});
    v.field("window", window, "adaptive: how many recent norms", positive<int64_t>());
    v.field("warmup", warmup, "adaptive: steps that only record norms before clipping starts",
            non_negative<int64_t>());
  }
};

struct GradHealthConfig {
  std::string policy = "skip_step";
  double explosion_factor = 0.0;
  int64_t warmup = 50;
  int64_t rollback_steps = 50;
  double rollback_lr_factor = 0.5;
  template <class V>
  void visit(V& v) {
    v.field("policy", policy,
            "on a non-finite or exploding gradient: warn | skip_step | rollback | stop",
            one_of({"warn", "skip_step", "rollback", "stop"}));
    v.field(
        "explosion_factor", explosion_factor,
        "a norm above this many times its running mean is an explosion (0: only non-finite counts)",
        non_negative<double>());
    v.field("warmup", warmup, "steps that build the running mean before explosions are judged",
            non_negative<int64_t>());
    v.field("rollback_steps", rollback_steps,
            "rollback: restore the in-memory snapshot at least this many steps old",
            positive<int64_t>());
    v.field("rollback_lr_factor", rollback_lr_factor,
            "rollback: multiply the LR by this after restoring", in_range(0.0, 1.0));
  }
};

struct EmaConfig {
  bool enabled = false;
  double decay = 0.999;
  bool evaluate = true;
  template <class V>
  void visit(V& v) {
    v.field("enabled", enabled, "keep an exponential moving average of the weights (checkpointed)");
    v.field("decay", decay, "ema = decay * ema + (1 - decay) * weights, every optimizer step",
            in_range(0.0, 1.0));
    v.field("evaluate", evaluate, "evaluate (and pick best checkpoints) with the averaged weights");
  }
};

struct StopMetricConfig {
  std::string monitor = "eval_loss";
  std::string mode = "min";
  double min_delta = 0.0;
  int64_t patience = 3;
  double stopping_threshold = NAN;
  double divergence_threshold = NAN;
  bool check_finite = true;
  template <class V>
  void visit(V& v) {
    v.field("monitor", monitor, "metric: train_loss or any of the task's eval_ metrics");
    v.field("mode", mode, "min or max is better", one_of({"min", "max"}));
    v.field("min_delta", min_delta, "an improvement smaller than this does not count",
            non_negative<double>());
    v.field("patience", patience, "evaluations without improvement before this metric says stop",
            non_negative<int64_t>());
    v.field("stopping_threshold", stopping_threshold,
            "stop at once when the metric reaches this (.nan: off)");
    v.field("divergence_threshold", divergence_threshold,
            "stop at once when the metric is worse than this (.nan: off)");
    v.field("check_finite", check_finite, "stop when the metric is NaN or infinite");
  }
};

struct EarlyStoppingConfig {
  std::string combine = "any";
  std::vector<StopMetricConfig> metrics;
  template <class V>
  void visit(V& v) {
    v.field("combine", combine,
            "first: the first metric decides; any: any one stalling; all: all stalled",
            one_of({"first", "any", "all"}));
    v.list("metrics", metrics, "monitored metrics (empty: no early stopping)");
  }
};

struct LabelSmoothingConfig {
  double value = 0.0;
  ScheduleConfig schedule;
  template <class V>
  void visit(V& v) {
    v.field("value", value, "label smoothing epsilon (start value when scheduled)",
            in_range(0.0, 1.0));
    v.section("schedule", schedule,
              "how epsilon changes over training (any LR schedule shape; default constant)");
  }
};

struct TrainConfig {
  Period duration = Period::epochs(10);
  Period eval_every = Period::epochs(1);
  Period log_every = Period::steps(100);
  double target_accuracy = 0.0;
  std::string final_eval = "full";
  int64_t final_eval_samples = 2000;
  bool tensorboard = true;
  Period histograms_every = Period::never();
  Count accumulate = Count::of(1);
  int64_t global_batch = 0;
  std::string lr_scaling = "none";
  template <class V>
  void visit(V& v) {
    v.field("duration", duration, "how long to train (10ep, 5000u optimizer steps)",
            period_enabled());
    v.field("accumulate", accumulate, "micro-batches per optimizer step (auto: from global_batch)");
    v.field("global_batch", global_batch,
            "samples per optimizer step over all ranks (0: off); accumulate: auto derives "
            "accumulate from it, "
            "otherwise batch_size x accumulate x world must equal it",
            non_negative<int64_t>());
    v.field("lr_scaling", lr_scaling,
            "scale optim.lr by (accumulate x world): none | linear | sqrt",
            one_of({"none", "linear", "sqrt"}));
    v.field("eval_every", eval_every, "evaluate on the held-out split every period");
    v.field("log_every", log_every, "log training metrics every period (non-terminal output)");
    v.field("target_accuracy", target_accuracy,
            "report time-to-accuracy for this test accuracy (0: off)", in_range(0.0, 1.0));
    v.field("final_eval", final_eval,
            "the test-split evaluation after training, for the summary: full (default: every "
            "test sample) | sample (final_eval_samples of them, evenly spaced) | none (the last "
            "evaluation on the test split if there was one, else no test metrics)",
            one_of({"full", "sample", "none"}));
    v.field("final_eval_samples", final_eval_samples,
            "test samples the final evaluation reads when final_eval is sample",
            positive<int64_t>());
    v.field("tensorboard", tensorboard,
            "also write every metrics record as TensorBoard scalars (events.out.tfevents.* in the "
            "run folder)");
    v.field("histograms_every", histograms_every,
            "TensorBoard histograms of every parameter every period (never: off)");
  }
};

struct CheckpointConfig {
  Period every = Period::epochs(1);
  int64_t keep_last = 2;
  int64_t keep_best = 1;
  std::string monitor = "auto";
  std::string mode = "auto";
  std::string resume = "auto";
  bool node_local = false;
  template <class V>
  void visit(V& v) {
    v.field("every", every,
            "save a checkpoint every period (also at the end and on SIGTERM/SIGINT)");
    v.field("keep_last", keep_last, "keep the newest N checkpoints", non_negative<int64_t>());
    v.field("keep_best", keep_best, "also keep the best N by monitor", non_negative<int64_t>());
    v.field("monitor", monitor,
            "metric for best-k: any of the task's eval_ metrics (auto: the task's headline "
            "metric, eval_accuracy for classification, else eval_loss)");
    v.field("mode", mode,
            "whether larger or smaller monitor values are better (auto: from the metric's name)",
            one_of({"auto", "max", "min"}));
    v.field("resume", resume,
            "auto: continue the newest unfinished run of this name; never; or a checkpoint folder");
    v.field("node_local", node_local,
            "run.dir is on each node's own disk: every node's first rank also writes each "
            "checkpoint (rank 0 alone writes metrics); a resume agrees on the newest step any "
            "rank holds and sends it to the ranks without it, whatever this says");
  }
};

// distributed.pipeline: the model cut into stages at block boundaries, one rank per stage, each
// batch sent through them as micro-batches (world = stages x data-parallel replicas).
struct PipelineConfig {
  int64_t stages = 1;
  AutoSize microbatches = 4;
  double target_bubble = 0.1;
  std::string schedule = "1f1b";
  template <class V>
  void visit(V& v) {
    v.field("stages", stages,
            "pipeline stages (1: no pipeline); the world must be a multiple: world = stages x "
            "replicas, consecutive ranks forming one pipeline (mlp and resnet, cut at block "
            "boundaries balanced by measured time)",
            positive<int64_t>());
    v.field("microbatches", microbatches,
            "micro-batches each loader batch is split into and sent through the stages; the "
            "bubble (idle share) is about (stages-1)/(microbatches+stages-1); auto: the fewest "
            "whose bubble is at most target_bubble (at most data.batch_size)",
            positive_size_or_auto());
    v.field("target_bubble", target_bubble,
            "microbatches: auto aims the formula's bubble at or below this share",
            in_range(0.001, 0.999));
    v.field("schedule", schedule,
            "gpipe (every forward, then every backward: M activations held) | 1f1b (one forward, "
            "one backward once the pipe is full: at most stages activations held); same "
            "gradients",
            one_of({"gpipe", "1f1b"}));
  }
};

struct DistributedConfig {
  std::string backend = "gloo";
  double timeout_s = 300;
  double bucket_mb = 25;
  bool overlap = true;
  std::string compress = "none";
  int64_t nproc_per_node = 0;
  int64_t max_restarts = 0;
  int64_t max_requeues = 3;
  Period rewarm = Period::never();
  Duration hang_timeout = Duration::never();
  bool doctor = true;
  std::string invariance = "none";
  int64_t virtual_shards = 12;
  int64_t invariance_threads = 1;
  PipelineConfig pipeline;
  template <class V>
  void visit(V& v) {
    v.field("backend", backend, "process group: gloo (CPU; NCCL builds: nccl)",
            one_of({"gloo", "nccl"}));
    v.field("invariance", invariance,
            "none: the world's ranks each reduce their batch (results move in the last bits with "
            "the world size) | bitwise: the same weights, bit for bit, at any world that divides "
            "distributed.virtual_shards, resumed on any such world (train.global_batch split into "
            "fixed virtual shards, each with its own forward and backward, summed exactly; "
            "docs/guide/distributed.md)",
            one_of({"none", "bitwise"}));
    v.field("virtual_shards", virtual_shards,
            "invariance: bitwise: shards per global batch (each always the same samples); the "
            "world must divide it (12: worlds 1, 2, 3, 4, 6, 12)",
            positive<int64_t>());
    v.field("invariance_threads", invariance_threads,
            "invariance: bitwise: intra-op threads of every rank (kernels may block by thread "
            "count, so every world computes a shard with the same number)",
            positive<int64_t>());
    v.field("timeout_s", timeout_s,
            "a collective that takes longer fails every rank instead of hanging",
            positive<double>());
    v.field("bucket_mb", bucket_mb,
            "gradient all-reduce bucket size (MB), launched from autograd hooks",
            positive<double>());
    v.field("overlap", overlap,
            "launch each bucket's all-reduce during backward (false: all after backward, to "
            "measure the overlap)");
    v.field("compress", compress,
            "gradients on the wire: none (fp32) | fp16 | bf16, pre-divided by the world size "
            "(PyTorch DDP's fp16/bf16 compress hooks); "
            "half the bytes, parameters still bitwise equal across ranks",
            one_of({"none", "fp16", "bf16"}));
    v.field("nproc_per_node", nproc_per_node,
            "> 1: `mltrain train` launches this many local ranks itself (as `mltrain launch`)",
            non_negative<int64_t>());
    v.field("max_restarts", max_restarts,
            "with nproc_per_node: restart the group from the latest checkpoint this many times",
            non_negative<int64_t>());
    v.field("max_requeues", max_requeues,
            "Slurm (mltrain slurm): on SIGUSR1/SIGTERM checkpoint and requeue the job at most this "
            "often",
            non_negative<int64_t>());
    v.field("rewarm", rewarm,
            "after a restart from a checkpoint, ramp the learning rate linearly from 0 back to the "
            "schedule's over this period (e.g. 200u; the field guide's advice when the world or "
            "the global batch changed), logged; never: resume at the scheduled rate");
    v.field("doctor", doctor,
            "the hang and straggler doctor (worlds > 1): each rank publishes its collectives, "
            "phase and step times to the rendezvous store; a rank without progress while the "
            "others wait for it (after hang_timeout, or by default twice the median step, at "
            "least 7 s) or whose collectives diverge from the others' is named (rank, host, pid, "
            "collective, phase, step) and the group fails, to be restarted by its launcher; a "
            "straggler is named in a warning");
    v.field("hang_timeout", hang_timeout,
            "a fixed time without progress after which the doctor names a hung rank (e.g. 60s; "
            "never: the doctor's own, twice the median step and at least 7 s)");
    v.section("pipeline", pipeline,
              "pipeline parallelism: stages, micro-batches and their schedule");
  }
};

struct MemoryConfig {
  std::string checkpoint = "none";
  int64_t checkpoint_every = 2;
  Count micro_batch = Count::automatic();
  template <class V>
  void visit(V& v) {
    v.field("checkpoint", checkpoint,
            "activation checkpointing (resnet, gpt): none | blocks (every block recomputed in "
            "backward instead of keeping its activations) | every_n (segments of "
            "checkpoint_every blocks: only segment inputs kept); gradients stay bitwise equal",
            one_of({"none", "blocks", "every_n"}));
    v.field("checkpoint_every", checkpoint_every, "every_n: blocks per checkpointed segment",
            positive<int64_t>());
    v.field("micro_batch", micro_batch,
            "samples per forward/backward: each loader batch is split into micro-batches whose "
            "gradients add up to the batch's (auto: the whole batch, or with data.batch_size=auto "
            "the largest that fits runtime.memory_budget, probed and cached)",
            positive_or_auto());
  }
};

// Where else a run's records go. mltrain's run folder (metrics.jsonl, TensorBoard events) is always
// written; an MLflow server gets the same records, exactly once (track/mlflow.hpp).
struct MlflowConfig {
  std::string uri = "";  // empty: MLFLOW_TRACKING_URI, else off
  std::string experiment = "";
  std::string artifacts = "config";
  Duration flush_timeout = Duration::of_seconds(30);
  template <class V>
  void visit(V& v) {
    v.field("uri", uri,
            "MLflow tracking server, http:// or https:// (empty: MLFLOW_TRACKING_URI if set, else "
            "no MLflow); records are sent from a background thread, exactly once, and a killed or "
            "resumed run continues where the server's acknowledgement left off",
            tracking_uri());
    v.field("experiment", experiment,
            "MLflow experiment, created if missing (empty: MLFLOW_EXPERIMENT_NAME, else the run "
            "name)");
    v.field("artifacts", artifacts,
            "files uploaded when the run finishes: none | config (config.yaml, and report.html "
            "if present) | model (also the best checkpoint's model.safetensors)",
            one_of({"none", "config", "model"}));
    v.field("flush_timeout", flush_timeout,
            "how long the end of a run waits for unsent records (e.g. 30s); what is left is sent "
            "by the next resume or `mltrain track push`");
  }
};

struct TrackingConfig {
  MlflowConfig mlflow;
  template <class V>
  void visit(V& v) {
    v.section("mlflow", mlflow, "an MLflow tracking server (REST; MLflow's usual variables)");
  }
};

struct ExperimentConfig {
  RunConfig run;
  TaskConfig task;
  RuntimeConfig runtime;
  DataConfig data;
  ModelConfig model;
  OptimConfig optim;
  ScheduleConfig schedule;
  TrainConfig train;
  AmpConfig amp;
  ClipConfig clip;
  GradHealthConfig grad_health;
  EmaConfig ema;
  EarlyStoppingConfig early_stopping;
  LabelSmoothingConfig label_smoothing;
  CheckpointConfig checkpoint;
  DistributedConfig distributed;
  MemoryConfig memory;
  TrackingConfig tracking;
  template <class V>
  void visit(V& v) {
    v.section("run", run, "naming, output folder and seed");
    v.section("task", task, "what is learnt: loss and held-out metrics");
    v.section("runtime", runtime, "device, threads, kernel route and allocator policy");
    v.section("data", data, "data set and loader");
    v.section("model", model, "architecture and init");
    v.section("optim", optim, "optimizer");
    v.section("schedule", schedule, "learning-rate schedule");
    v.section("train", train, "training loop");
    v.section("amp", amp, "mixed precision");
    v.section("clip", clip, "gradient clipping");
    v.section("grad_health", grad_health, "non-finite and exploding gradients");
    v.section("ema", ema, "exponential moving average of the weights");
    v.section("early_stopping", early_stopping, "stop when monitored metrics stall or diverge");
    v.section("label_smoothing", label_smoothing, "label smoothing, fixed or scheduled");
    v.section("checkpoint", checkpoint, "checkpoints and resume");
    v.section("distributed", distributed,
              "data-parallel ranks (world from torchrun/Slurm variables or mltrain launch)");
    v.section("memory", memory, "activation checkpointing and micro-batches");
    v.section("tracking", tracking, "tracking servers that receive the run's records");
  }
};

// Loads, applies overrides, validates (field checks and cross-field rules); throws one
// ConfigError listing every problem. An empty path means defaults + overrides only.
ExperimentConfig load_experiment(const std::string& path,
                                 const std::vector<std::string>& overrides);
std::string to_yaml(const ExperimentConfig& cfg);

// The metrics a run of this config reports, with their global names: train_loss and the task's
// eval_* metrics (custom tasks add the model's own names at run time).
std::vector<std::string> task_metrics(const ExperimentConfig& cfg);
// Config-time notes on valid settings that look like a mistake (printed by `config check` and at
// the start of a run), each with its fix.
std::vector<std::string> recipe_notes(const ExperimentConfig& cfg);
// data.sampler as one weight per class (empty: uniform sampling).
std::vector<double> sampler_class_weights(const ExperimentConfig& cfg);
// "max" for metrics where larger is better (accuracy, r2, roc_auc, f1), else "min".
std::string metric_mode(const std::string& metric);
// checkpoint.monitor / checkpoint.mode with `auto` resolved for the task.
std::string checkpoint_monitor(const ExperimentConfig& cfg);
std::string checkpoint_mode(const ExperimentConfig& cfg);
std::string schema_text();
// runtime.memory_budget in bytes (0: none). "512MiB", "2GiB", "1.5GB", "800MB", "none".
int64_t memory_budget_bytes(const std::string& text);

}  // namespace mltrain::config
