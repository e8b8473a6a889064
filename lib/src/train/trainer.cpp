#include "mltrain/train/trainer.hpp"


#include "mltrain/core/error.hpp"
#include "mltrain/core/signals.hpp"
#include "mltrain/optim/schedule.hpp"

namespace mltrain::train {

using Clock = std::chrono::steady_clock;
static double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

Trainer::Trainer(const config::ExperimentConfig& cfg, model::Model& model, optim::Optimizer& opt, data::Loader& train,
                 data::Loader& eval)
    : cfg_(cfg), model_(model), opt_(opt), train_(train), eval_(eval) {
  steps_per_epoch_ = train_.batches_per_epoch();
  if (steps_per_epoch_ == 0)
    throw ConfigError("data.batch_size", "larger than the training set (" + std::to_string(train_.samples_per_epoch()) +
                                             " samples): no full batch", "lower data.batch_size");
  total_steps_ = cfg_.train.duration.to_steps(steps_per_epoch_);
  schedule_ = std::make_unique<optim::Schedule>(cfg_.schedule, cfg_.optim.lr, total_steps_, steps_per_epoch_);
}


EvalResult Trainer::evaluate(data::Loader& loader) {
  const auto t0 = Clock::now();
  torch::NoGradGuard no_grad;
  model_.set_training(false);
  double loss_sum = 0;
  int64_t correct = 0, count = 0;
  loader.start_epoch(0);
  data::Batch b;
  while (loader.next(b)) {
    auto logits = model_.forward(b.x);
    loss_sum += torch::nn::functional::cross_entropy(
                    logits, b.y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .item<double>();
    correct += logits.argmax(1).eq(b.y).sum().item<int64_t>();
    count += b.y.size(0);
  }
  model_.set_training(true);
  EvalResult r{count ? loss_sum / count : 0, count ? double(correct) / count : 0, count, since(t0)};
  return r;
}

void Trainer::fit() {
  const int64_t eval_every = cfg_.train.eval_every.to_steps(steps_per_epoch_);
  const auto fit_start = Clock::now();
  const double seconds_before = progress_.train_seconds;
  for (auto& o : observers_) o->on_train_begin(*this);
  model_.set_training(true);

  while (progress_.step < total_steps_) {
    train_.start_epoch(progress_.epoch, progress_.batch_in_epoch);
    data::Batch batch;
    auto t_data = Clock::now();
    while (progress_.step < total_steps_ && train_.next(batch)) {
      const double data_s = since(t_data);
      const auto t_step = Clock::now();

      auto logits = model_.forward(batch.x);
      auto loss = torch::nn::functional::cross_entropy(logits, batch.y);
      opt_.zero_grad();
      loss.backward();
      const double lr = lr_at(progress_.step);
      opt_.step(lr);

      StepInfo info;
      info.loss = loss.item<double>();
      info.correct = logits.argmax(1).eq(batch.y).sum().item<int64_t>();
      info.count = batch.y.size(0);
      info.lr = lr;
      info.data_seconds = data_s;
      info.step_seconds = since(t_step) + data_s;

      progress_.step += 1;
      progress_.batch_in_epoch = batch.index + 1;
      if (progress_.batch_in_epoch >= steps_per_epoch_) {
        progress_.epoch += 1;
        progress_.batch_in_epoch = 0;
      }
      progress_.train_seconds = seconds_before + since(fit_start);

      if (eval_every > 0 && (progress_.step % eval_every == 0 || progress_.step == total_steps_)) {
        last_eval_ = evaluate(eval_);
        schedule_->observe(progress_.step,
                           cfg_.schedule.monitor == "eval_loss" ? last_eval_->loss : last_eval_->accuracy);
        if (cfg_.train.target_accuracy > 0 && !progress_.time_to_target &&
            last_eval_->accuracy >= cfg_.train.target_accuracy)
          progress_.time_to_target = seconds_before + since(fit_start);
        for (auto& o : observers_) o->on_eval_end(*this, *last_eval_);
      }
      for (auto& o : observers_) o->on_step_end(*this, info);

      if (const int sig = stop_signal()) {
        for (auto& o : observers_) o->on_stop_request(*this, sig);
        throw Interrupted(sig);
      }
      t_data = Clock::now();
    }
  }
  progress_.train_seconds = seconds_before + since(fit_start);
  for (auto& o : observers_) o->on_train_end(*this);
}

}  // namespace mltrain::train
