// The doctor report as an aligned text table and as JSON (schema in docs/DOCTOR.md).
#include <cstdio>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/progress.h"
#include "k3prep/doctor/doctor.h"

namespace k3::prep {
namespace {

using Row = std::pair<std::string, std::string>;

std::string Fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::vector<std::pair<const char*, bool>> CpuFlags(const CpuReport& c) {
  return {{"avx2", c.base.avx2},       {"fma", c.base.fma},         {"avx512f", c.base.avx512f},
          {"avx512bw", c.base.avx512bw}, {"avx512vl", c.avx512vl},  {"avx512dq", c.avx512dq},
          {"avx512cd", c.avx512cd},    {"avx512vnni", c.avx512vnni}, {"avx512bf16", c.avx512bf16},
          {"f16c", c.f16c},            {"bmi2", c.bmi2},            {"sha_ni", c.sha_ni}};
}

std::string CpuLine(const CpuReport& c) {
  std::string have, lack;
  for (const auto& [name, on] : CpuFlags(c)) (on ? have : lack) += std::string(" ") + name;
  return (have.empty() ? "none of the listed" : have.substr(1)) +
         (lack.empty() ? "" : "  (absent:" + lack + ")");
}

std::string FloorLine(const BudgetFloor& f) {
  return DecimalGb(f.total()) + " (trunk " + DecimalGb(f.trunk_min) + " + expert cache " +
         DecimalGb(f.cache_min) + ")";
}

// "rank 1   trunk 3.46 MB on disk (not read), experts 2-3 × 12 layers = 24 in RAM (158.21 kB),
// budget --budget-gb 0.257, disk 3.90 MB".
void AddRankRows(const RanksReport& k, std::vector<Row>* rows) {
  rows->emplace_back("ranks", std::to_string(k.ranks) + ", " + k.map + " (sizes from " +
                                  k.basis + ")");
  for (const RankNeeds& n : k.per_rank) {
    const std::string experts =
        n.expert_end - n.expert_begin == 1
            ? "expert " + std::to_string(n.expert_begin)
            : "experts " + std::to_string(n.expert_begin) + "-" + std::to_string(n.expert_end - 1);
    rows->emplace_back(
        "rank " + std::to_string(n.rank),
        "trunk " + DecimalGb(n.trunk_bytes) + (n.reads_trunk ? " read" : " on disk (not read)") +
            ", " + experts + " of each MoE layer = " + std::to_string(n.experts) + " in RAM (" +
            DecimalGb(n.share_ram_bytes) + "), budget --budget-gb " +
            BudgetFlagGb(n.budget_bytes + 999'999) + ", disk " + DecimalGb(n.disk_bytes));
  }
}

std::vector<Row> Rows(const DoctorReport& r) {
  std::vector<Row> rows;
  rows.emplace_back("cpu", CpuLine(r.cpu));
  rows.emplace_back("kernel path", r.kernel_path);
  rows.emplace_back("cores", std::to_string(r.cores));
  const MemoryReport& m = r.memory;
  if (m.available) {
    rows.emplace_back("MemAvailable", DecimalGb(*m.available) + " (80 % = " +
                                          DecimalGb(m.usable) + ")");
    rows.emplace_back("suggested budget",
                      m.suggested_preset.empty()
                          ? "no preset fits; --budget-gb " + BudgetFlagGb(m.usable)
                          : "--preset " + m.suggested_preset);
  } else {
    rows.emplace_back("MemAvailable", "unknown");
  }
  rows.emplace_back("released model",
                    std::string(m.released_fits ? "fits" : "does not fit") + " (floor " +
                        DecimalGb(kReleasedFloorBytes) + " = laptop; trunk minimum " +
                        DecimalGb(m.released_trunk_min) + ")");
  if (m.largest_synth) {
    rows.emplace_back("largest synth fit", m.largest_synth->preset + " (needs " +
                                               DecimalGb(m.largest_synth->floor.total()) + ")");
  }
  rows.emplace_back("io_uring", r.uring.available ? "available" : "refused: " + r.uring.reason);
  rows.emplace_back("directory", r.dir_abs.empty() ? r.dir : r.dir_abs);
  if (!r.fs.name.empty()) rows.emplace_back("file system", r.fs.name);
  if (!r.dir_abs.empty()) {
    rows.emplace_back("writable", r.writable.writable ? "yes" : "no: " + r.writable.reason);
  }
  if (r.dir_ok) {
    rows.emplace_back("O_DIRECT", r.direct.available
                                      ? "available (alignment " +
                                            std::to_string(r.direct.alignment) + ")"
                                      : "refused: " + r.direct.reason);
  }
  if (r.free_bytes) rows.emplace_back("free space", DecimalGb(*r.free_bytes));
  if (r.dir_ok) {
    rows.emplace_back("model", r.model.summary);
    if (r.model.floor) rows.emplace_back("model floor", FloorLine(*r.model.floor));
  }
  if (r.ranks) AddRankRows(*r.ranks, &rows);
  const ProbeSection& p = r.probe;
  rows.emplace_back("read size", std::to_string(p.requested_read_bytes) + " B (" +
                                     p.read_source + ")");
  if (!p.ran) {
    rows.emplace_back("read probe", "skipped: " + p.skipped);
  } else {
    rows.emplace_back("read backend", p.result.backend + ", O_DIRECT (page cache bypassed)");
    rows.emplace_back("scratch write",
                      Fixed(p.result.write_mb_per_s, 1) + " MB/s (" +
                          FormatIecBytes(double(p.result.file_bytes)) + ", sequential)");
    for (const DepthResult& d : p.result.depths) {
      rows.emplace_back("random read QD" + std::to_string(d.queue_depth),
                        Fixed(d.mb_per_s(), 1) + " MB/s, " + Fixed(d.iops(), 1) + " IOPS (" +
                            std::to_string(d.reads) + " reads of " +
                            std::to_string(p.result.read_bytes) + " B in " +
                            Fixed(d.seconds, 2) + " s)");
    }
  }
  return rows;
}

}  // namespace

std::string RenderDoctorText(const DoctorReport& r) {
  const std::vector<Row> rows = Rows(r);
  size_t width = 0;
  for (const Row& row : rows) width = std::max(width, row.first.size());
  std::string s = "k3prep doctor " + r.dir + "\n";
  for (const Row& row : rows) {
    s += "  " + row.first + std::string(width - row.first.size() + 2, ' ') + row.second + "\n";
  }
  for (const std::string& n : r.notes) s += "note: " + n + "\n";
  for (const std::string& w : r.warnings) s += "warning: " + w + "\n";
  for (const std::string& b : r.blocking) s += "BLOCKING: " + b + "\n";
  if (!r.next_command.empty()) s += "next: " + r.next_command + "\n";
  return s;
}

std::string RenderDoctorJson(const DoctorReport& r) {
  using nlohmann::ordered_json;
  ordered_json j;
  j["format"] = "k3-doctor";
  j["version"] = 1;
  j["dir"] = r.dir;
  j["dir_abs"] = r.dir_abs.empty() ? ordered_json(nullptr) : ordered_json(r.dir_abs);
  ordered_json cpu = ordered_json::object();
  for (const auto& [name, on] : CpuFlags(r.cpu)) cpu[name] = on;
  j["cpu"] = cpu;
  j["kernel_path"] = r.kernel_path;
  j["cores"] = r.cores;
  const MemoryReport& m = r.memory;
  auto opt = [](const std::optional<uint64_t>& v) {
    return v ? ordered_json(*v) : ordered_json(nullptr);
  };
  auto floor_json = [](const BudgetFloor& f) {
    return ordered_json{{"total_bytes", f.total()},   {"trunk_min_bytes", f.trunk_min},
                        {"cache_min_bytes", f.cache_min}, {"largest_run_bytes", f.largest_run},
                        {"largest_expert_bytes", f.largest_expert}};
  };
  j["memory"] = {
      {"mem_available_bytes", opt(m.available)},
      {"usable_bytes", m.available ? ordered_json(m.usable) : ordered_json(nullptr)},
      {"suggested_preset",
       m.suggested_preset.empty() ? ordered_json(nullptr) : ordered_json(m.suggested_preset)},
      {"released_floor_bytes", kReleasedFloorBytes},
      {"released_trunk_min_bytes", m.released_trunk_min},
      {"released_fits", m.released_fits},
      {"largest_synth_preset",
       m.largest_synth ? ordered_json(m.largest_synth->preset) : ordered_json(nullptr)},
  };
  j["io_uring"] = {{"available", r.uring.available}, {"reason", r.uring.reason}};
  j["directory"] = {{"usable", r.dir_ok},
                    {"filesystem", r.fs.name},
                    {"in_memory", r.fs.in_memory},
                    {"writable", r.writable.writable},
                    {"writable_reason", r.writable.reason},
                    {"free_bytes", opt(r.free_bytes)}};
  j["o_direct"] = {{"available", r.direct.available},
                   {"alignment", r.direct.alignment},
                   {"reason", r.direct.reason}};
  ordered_json model = {{"kind", ModelKindName(r.model.kind)},
                        {"summary", r.model.summary},
                        {"problem", r.model.problem},
                        {"expert_bytes", r.model.expert_bytes},
                        {"expert_dir", r.model.expert_dir}};
  model["floor"] = r.model.floor ? floor_json(*r.model.floor) : ordered_json(nullptr);
  j["model"] = model;
  const ProbeSection& p = r.probe;
  ordered_json probe = {{"ran", p.ran},
                        {"skipped", p.skipped},
                        {"read_bytes_requested", p.requested_read_bytes},
                        {"read_size_source", p.read_source},
                        {"page_cache_bypassed", p.ran}};
  if (p.ran) {
    probe["backend"] = p.result.backend;
    probe["file_bytes"] = p.result.file_bytes;
    probe["read_bytes"] = p.result.read_bytes;
    probe["write_mb_per_s"] = p.result.write_mb_per_s;
    ordered_json depths = ordered_json::array();
    for (const DepthResult& d : p.result.depths) {
      depths.push_back({{"queue_depth", d.queue_depth},
                        {"reads", d.reads},
                        {"bytes", d.bytes},
                        {"seconds", d.seconds},
                        {"mb_per_s", d.mb_per_s()},
                        {"iops", d.iops()}});
    }
    probe["depths"] = depths;
  }
  j["probe"] = probe;
  if (r.ranks) {
    ordered_json per_rank = ordered_json::array();
    for (const RankNeeds& n : r.ranks->per_rank) {
      per_rank.push_back({{"rank", n.rank},
                          {"expert_begin", n.expert_begin},
                          {"expert_end", n.expert_end},
                          {"experts", n.experts},
                          {"trunk_bytes", n.trunk_bytes},
                          {"reads_trunk", n.reads_trunk},
                          {"share_ram_bytes", n.share_ram_bytes},
                          {"budget_bytes", n.budget_bytes},
                          {"disk_bytes", n.disk_bytes}});
    }
    j["ranks"] = {{"ranks", r.ranks->ranks},
                  {"map", r.ranks->map},
                  {"basis", r.ranks->basis},
                  {"rank0_base_budget_bytes", r.ranks->rank0_base},
                  {"per_rank", per_rank}};
  } else {
    j["ranks"] = nullptr;
  }
  j["next_command"] = r.next_command.empty() ? ordered_json(nullptr) : ordered_json(r.next_command);
  j["notes"] = r.notes;
  j["warnings"] = r.warnings;
  j["blocking"] = r.blocking;
  return j.dump(2, ' ', false, ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace k3::prep
