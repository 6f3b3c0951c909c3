#include "k3prep/doctor/command.h"

#include <cstdio>
#include <memory>
#include <string>

#include "common/env.h"
#include "formats/expert_share.h"
#include "k3prep/doctor/doctor.h"

namespace k3::prep {
namespace {

class DoctorApp : public CLI::App {
 public:
  explicit DoctorApp(const OutputOptions* parent_out)
      : CLI::App("check this machine and DIR for running Kimi K3: CPU, memory budget, io_uring, "
                 "O_DIRECT, random-read bandwidth, free space; prints the next command "
                 "(docs/DOCTOR.md)",
                 "doctor"),
        parent_out_(parent_out) {
    add_option("DIR", opts.dir,
               "directory that holds (or will hold) the model: empty, a checkpoint or a prepared "
               "directory")
        ->default_val(".");
    add_option("--probe-mb", probe_mb,
               "size of the scratch file the read probe writes in DIR, MiB (needs this + 1 GB "
               "free; removed afterwards)")
        ->default_val(1024)
        ->check(InRange(1, 1 << 20));
    add_option("--probe-seconds", opts.probe_seconds,
               "time spent reading at each queue depth (1 and 16)")
        ->default_val(3.0)
        ->check(InRange(0, 3600));
    add_option("--read-size", read_size,
               "bytes per probe read (default: the largest expert record of a prepared DIR, else "
               "one released expert, 17547264)")
        ->check(InRange(1, 4294967296.0));
    add_flag("--no-probe", no_probe, "skip the read probe (writes nothing big to DIR)");
    add_flag("--pread", opts.force_pread, "probe with the pread thread pool instead of io_uring");
    add_option("--ranks", opts.ranks,
               "also print what each rank of an N-rank MPI run needs: trunk, its expert share "
               "in RAM, a budget and its share directory's disk (docs/SCALE-OUT.md)")
        ->check(InRange(1, prepared::kMaxRanks));
    AddOutputFlags(this, &own_out);
    AddJsonFlag(this, &own_out);
  }

  Status Run() {
    opts.probe_bytes = probe_mb << 20;
    opts.probe = !no_probe;
    if (count("--read-size") > 0) opts.read_size = read_size;
    const bool json = own_out.json || (parent_out_ != nullptr && parent_out_->json);
    const DoctorReport report = RunDoctor(Env::Default(), opts);
    const std::string text = json ? RenderDoctorJson(report) : RenderDoctorText(report);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return report.Verdict();
  }

 private:
  DoctorOptions opts;
  uint64_t probe_mb = 1024;
  uint64_t read_size = 0;
  bool no_probe = false;
  OutputOptions own_out;
  const OutputOptions* parent_out_;
};

}  // namespace

CLI::App* AddDoctorCommand(CLI::App* app, const OutputOptions* out) {
  return app->add_subcommand(std::make_shared<DoctorApp>(out));
}

Status RunDoctorCommand(CLI::App* cmd) {
  auto* doctor = dynamic_cast<DoctorApp*>(cmd);
  if (doctor == nullptr) {
    return Status::Invalid("internal: RunDoctorCommand needs AddDoctorCommand's app");
  }
  return doctor->Run();
}

}  // namespace k3::prep
