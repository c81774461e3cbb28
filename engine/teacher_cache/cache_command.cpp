// engine/teacher_cache/cache_command.cpp: see cache_command.h.
#include "engine/teacher_cache/cache_command.h"

#include <boost/program_options.hpp>
#include <filesystem>
#include <iostream>

#include "common/compute_threads.h"
#include "common/user_error.h"
#include "distill/teacher_top_k.h"
#include "engine/checkpoint/stage_agreement.h"
#include "engine/config/command_line.h"
#include "engine/config/config.h"
#include "engine/config/precision_policy.h"
#include "engine/data/batches.h"
#include "engine/data/data_setup.h"
#include "engine/teacher_cache/cache_fingerprint.h"
#include "engine/teacher_cache/cache_store.h"
#include "engine/teacher_cache/teacher_source.h"
#include "engine/train/tokenizer_identity.h"
#include "engine/train/trainer_builder.h"
#include "parallel/mesh.h"
#include "parallel/pipeline_partition.h"

namespace po = boost::program_options;

namespace retort::engine {
namespace {

// The teacher's entries of samples [first, first + count) through this rank's stage; on the last
// stage the samples' entries (empty elsewhere). Collective over the TP and PP groups.
std::vector<CachedSample> teacher_entries(const distill::Teacher& teacher, BlendedSamples& samples,
                                          int64_t first, int64_t count, int64_t k,
                                          double temperature, parallel::Mesh& mesh,
                                          const layers::TensorParallel& tp,
                                          torch::ScalarType residual) {
  const layers::ModelStage& stage = teacher.model().stage();
  const int64_t seq_len = samples.seq_len();
  const int pp = mesh.coordinates().pp;
  torch::Tensor hidden;
  if (stage.embedding) {
    const TokenBatch batch = read_batch(samples, first, count);
    hidden = teacher.embed(torch::tensor(batch.inputs, torch::kLong).view({count, seq_len}));
  } else {
    const int64_t local_seq = tp.sequence_parallel ? seq_len / tp.size() : seq_len;
    hidden = torch::empty({count, local_seq, teacher.config().hidden}, torch::dtype(residual));
    mesh.pp().recv(hidden, pp - 1);
  }
  hidden = teacher.run_blocks(hidden, seq_len, nullptr);
  if (!stage.head) {
    mesh.pp().send(hidden.to(residual).contiguous(), pp + 1);
    return {};
  }
  const torch::Tensor logits = teacher.head_logits(hidden);
  const distill::TeacherTopK top = distill::teacher_top_k(
      logits.reshape({-1, logits.size(-1)}), teacher.config().vocab_size, k, temperature, tp);
  const torch::Tensor lp = top.log_probs.to(torch::kDouble).contiguous();
  const torch::Tensor ids = top.ids.contiguous();
  const torch::Tensor tail = top.tail_log_mass.to(torch::kDouble).contiguous();
  std::vector<CachedSample> entries(static_cast<size_t>(count));
  const int64_t per_sample = seq_len * k;
  for (int64_t i = 0; i < count; ++i) {
    CachedSample& e = entries[size_t(i)];
    e.log_probs.assign(lp.data_ptr<double>() + i * per_sample,
                       lp.data_ptr<double>() + (i + 1) * per_sample);
    e.ids.assign(ids.data_ptr<int64_t>() + i * per_sample,
                 ids.data_ptr<int64_t>() + (i + 1) * per_sample);
    e.tail_log_mass.assign(tail.data_ptr<double>() + i * seq_len,
                           tail.data_ptr<double>() + (i + 1) * seq_len);
  }
  return entries;
}

// The header of the cache the request asks for: its shape and fingerprint.
TeacherCacheHeader cache_header(const TrainConfig& config, const TeacherSource& source,
                                const TeacherCacheRequest& request) {
  const layers::ModelConfig& teacher = source.model;
  const int64_t k =
      request.top_k > 0 ? request.top_k : config.distill.objective.logits.teacher_top_k;
  if (k <= 0)
    throw UserError(
        "engine_teacher_cache: give --top-k K or distill.teacher_top_k (the "
        "teacher's entries kept per position)");
  if (k > teacher.vocab_size)
    throw UserError("--top-k " + std::to_string(k) + " is above the teacher's vocabulary (" +
                    std::to_string(teacher.vocab_size) + ")");
  if (request.samples_per_shard <= 0)
    throw UserError("--samples-per-shard " + std::to_string(request.samples_per_shard) +
                    ": a shard holds at least one sample");
  if (request.samples < 0)
    throw UserError("--samples " + std::to_string(request.samples) + ": a count of samples");
  TokenizerIdentity tokenizer = tokenizer_of_data(config.data.tokenizer);
  if (!source.path.empty()) {
    const TokenizerIdentity teachers = tokenizer_of_model(source.path, source.hf);
    require_same_tokenizer(tokenizer, teachers, "teacher.checkpoint",
                           "a teacher must read the data's ids as the same tokens");
    tokenizer = known_of(tokenizer, teachers);
  }
  TeacherCacheHeader header;
  header.shape = {
      config.data.seq_len,
      k,
      teacher.vocab_size,
      request.samples > 0 ? request.samples : config.training.steps * config.training.global_batch,
      request.samples_per_shard,
      request.values};
  header.fingerprint = cache_fingerprint(config, source.identity(), tokenizer.fingerprint);
  return header;
}

// The teacher's configured layout, resolved for its own sizes too.
parallel::Layout teacher_layout(const TrainConfig& config, int world_size) {
  const layers::ModelConfig teacher = resolve_teacher_source(config.distill).model;
  return parallel::resolve_layout(
      config.layout, world_size,
      {teacher.heads, teacher.kv_heads, teacher.ffn_hidden,
       std::max<int64_t>(teacher.layers, config.layout.pipeline), config.data.seq_len});
}

}  // namespace

void write_teacher_cache(const TrainConfig& config, const TeacherCacheRequest& request,
                         parallel::Mesh& mesh, std::ostream* log) {
  const bool root = mesh.world().rank() == 0;
  TeacherSource source;
  TeacherCacheHeader header;
  SampleStreams streams;
  // The header on rank 0 alone: its fingerprint reads every data file, and a Hugging Face
  // teacher's every weight file, through a CRC. The other ranks open what rank 0 wrote.
  run_agreed_over(&mesh.world(), [&] {
    if (request.out.empty()) throw UserError("engine_teacher_cache: give --out DIR");
    source = resolve_teacher_source(config.distill);
    if (root) header = cache_header(config, source, request);
    streams = build_sample_streams(config.data, config.seed,
                                   {source.model.vocab_size, "the teacher's vocab_size"});
  });
  // The training samples in `out`; the validation samples a run evaluates on in `out`/valid.
  struct Split {
    std::string dir;
    TeacherCacheHeader header;  // rank 0's; the others take the writer's
    BlendedSamples* samples;
    std::unique_ptr<TeacherCacheWriter> writer;
    std::vector<int64_t> mine;  // this DP group's shards still to write
  };
  std::vector<Split> splits;
  header.fingerprint["split"] = "training";
  splits.push_back({request.out, header, streams.train.get(), nullptr, {}});
  const int64_t valid_samples = config.training.eval_batches * config.training.global_batch;
  if (streams.valid && valid_samples > 0) {
    TeacherCacheHeader valid = header;
    valid.shape.samples = valid_samples;
    valid.fingerprint["split"] = "validation";
    splits.push_back({validation_cache_dir(request.out), valid, streams.valid.get(), nullptr, {}});
  }
  // Each folder and its header first (rank 0), then every other rank opens them as they are.
  run_agreed_over(&mesh.world(), [&] {
    if (root)
      for (Split& split : splits)
        split.writer =
            std::make_unique<TeacherCacheWriter>(split.dir, split.header, request.resume);
  });
  run_agreed_over(&mesh.world(), [&] {
    if (!root)
      for (Split& split : splits) split.writer = std::make_unique<TeacherCacheWriter>(split.dir);
  });
  const parallel::DataSplit data = mesh.data_split();
  for (Split& split : splits)
    for (int64_t shard = data.index; shard < split.writer->shard_count(); shard += data.count)
      if (!split.writer->shard_done(shard)) split.mine.push_back(shard);
  mesh.world().barrier();  // every rank has looked before any writes

  layers::TensorParallel tp;
  tp.group = &mesh.tp();
  tp.sequence_parallel = config.layout.sequence_parallel && config.layout.tensor > 1;
  const PrecisionPolicy precision = precision_policy(config);
  const int pp = mesh.coordinates().pp, stages = config.layout.pipeline;
  const parallel::LayerRange layers_here =
      parallel::split_layers(source.model.layers, stages, {})[size_t(pp)];
  distill::Teacher teacher(source.model, source.seed, scalar_type_of(precision.compute), tp,
                           {layers_here.first, layers_here.end, pp == 0, pp == stages - 1});
  const torch::ScalarType residual = scalar_type_of(precision.residual);
  teacher.set_residual_type(residual);
  run_agreed_over(&mesh.world(),
                  [&] { load_teacher_weights(source, source.model, mesh, tp, teacher); });

  const bool writes = pp == stages - 1 && mesh.tp().rank() == 0;
  const int64_t micro = config.training.micro_batch;
  const double temperature = config.distill.objective.logits.temperature;
  for (Split& split : splits)
    for (int64_t shard : split.mine) {
      const auto [first, count] = split.writer->shard_samples(shard);
      std::vector<CachedSample> entries;
      for (int64_t at = first; at < first + count; at += micro) {
        std::vector<CachedSample> part =
            teacher_entries(teacher, *split.samples, at, std::min(micro, first + count - at),
                            split.writer->header().shape.top_k, temperature, mesh, tp, residual);
        entries.insert(entries.end(), std::make_move_iterator(part.begin()),
                       std::make_move_iterator(part.end()));
      }
      if (writes) split.writer->write_shard(shard, entries);
      if (log && root)
        *log << "engine_teacher_cache: " << split.writer->shard_path(shard) << " (samples " << first
             << " to " << first + count - 1 << ")" << std::endl;
    }
  mesh.world().barrier();
  if (log && root)
    for (const Split& split : splits)
      *log << TeacherCacheReader(split.dir).describe() << std::flush;
}

namespace {

int write_cache(const ConfigCommandLine& line, const TeacherCacheRequest& request,
                parallel::MpiRuntime& mpi) {
  TrainConfig config;
  {
    parallel::Communicator world(MPI_COMM_WORLD, "world");
    run_agreed_over(&world, [&] {
      config = make_train_config(Config::load(line.config, line.overrides), mpi.world_size());
      config.layout = teacher_layout(config, mpi.world_size());
    });
  }
  set_compute_threads(config.runtime.threads > 0 ? int(config.runtime.threads)
                                                 : mpi.threads_per_rank());
  parallel::Mesh mesh(config.layout);
  mesh.choose_transports(parallel::TransportChoice::automatic, -1);
  write_teacher_cache(config, request, mesh, mpi.world_rank() == 0 ? &std::cout : nullptr);
  return 0;
}

}  // namespace

int run_teacher_cache_command(int argc, char** argv, parallel::MpiRuntime& mpi) {
  po::options_description described(
      "Usage: engine_teacher_cache CONFIG.yaml [key=value ...] --out DIR [options]\n"
      "       engine_teacher_cache --info DIR");
  TeacherCacheRequest request;
  std::string info, values;
  described.add_options()("help,h", "print this help")("out", po::value<std::string>(&request.out),
                                                       "the cache's folder")(
      "top-k", po::value<int64_t>(&request.top_k)->default_value(0),
      "entries kept per position (0: distill.teacher_top_k)")(
      "samples", po::value<int64_t>(&request.samples)->default_value(0),
      "cover training samples 0 .. N-1 (0: training.steps x training.global_batch)")(
      "samples-per-shard", po::value<int64_t>(&request.samples_per_shard)->default_value(64),
      "consecutive samples per shard file (the unit of resuming and of data parallelism)")(
      "values", po::value<std::string>(&values)->default_value("float16"),
      "how log-probabilities are stored: float16 (2 bytes) or float64 (exact, 8 bytes)")(
      "resume", po::bool_switch(&request.resume),
      "go on writing the cache in --out (made with the same config and options)")(
      "info", po::value<std::string>(&info),
      "print a cache's header, fingerprint, size and bytes per token, then exit");
  const ConfigCommandLine line = parse_config_command_line(argc, argv, described);
  const bool root = mpi.world_rank() == 0;
  if (line.options.count("help")) {
    if (root) std::cout << described;
    return 0;
  }
  if (!info.empty()) {
    if (root) {
      std::cout << TeacherCacheReader(info).describe() << std::flush;
      if (std::filesystem::exists(validation_cache_dir(info) + "/cache.json"))
        std::cout << TeacherCacheReader(validation_cache_dir(info)).describe() << std::flush;
    }
    return 0;
  }
  if (line.config.empty())
    throw UserError("no config file given (usage: engine_teacher_cache CONFIG.yaml --out DIR)");
  request.values = parse_value_type(values, "--values");
  return write_cache(line, request, mpi);
}

}  // namespace retort::engine
