// k3run as a user runs it: the real executable with stdout on a pseudo-terminal (clean text, a
// final newline, no step lines), a prompt piped on stdin, --version without PREPARED, and the
// messages for a PREPARED that is missing, a checkpoint, or an unfinished pack.
#include <fcntl.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "tests/k3run/engine_fixture.h"
#include "tests/support/files.h"
#include "tests/support/temp_dir.h"

namespace k3::run::testing {
namespace {

namespace fs = std::filesystem;

const std::string& K3runBinary() {
  static const std::string path = std::string(K3_BINARY_DIR) + "/k3run/k3run";
  return path;
}

bool Has(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

struct TtyRun {
  int exit_code = -1;
  std::string terminal;  // what the pseudo-terminal showed (the line discipline maps \n → \r\n)
  std::string stderr_text;
};

// Runs k3run with stdout on a pseudo-terminal, stderr to a file and stdin from /dev/null.
TtyRun RunOnTerminal(const std::vector<std::string>& args, const test::TempDir& tmp) {
  TtyRun run;
  int master = -1, slave = -1;
  if (::openpty(&master, &slave, nullptr, nullptr, nullptr) != 0) {
    ADD_FAILURE() << "openpty: " << std::strerror(errno);
    return run;
  }
  const std::string err = tmp.Join("stderr.txt");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(master);
    const int in = ::open("/dev/null", O_RDONLY);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(in, 0);
    ::dup2(slave, 1);
    ::dup2(e, 2);
    std::vector<std::string> owned = {K3runBinary()};
    owned.insert(owned.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : owned) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(slave);
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(master, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EIO once the child has closed the terminal
    run.terminal.append(buf, static_cast<size_t>(n));
  }
  ::close(master);
  int status = 0;
  ::waitpid(pid, &status, 0);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  run.stderr_text = test::ReadWholeFile(err);
  return run;
}

// Runs a shell command line; returns its exit code.
int Shell(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(K3runTerminal, CleanTextAndAFinalNewlineNoStepLines) {
  test::TempDir tmp;
  const std::string report = tmp.Join("r.json");
  const TtyRun r = RunOnTerminal({TinyPreparedDir(), "--prompt", "The quick brown fox", "--gen",
                                  "8", "--ignore-eos", "--no-floor", "--out", report},
                                 tmp);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_FALSE(Has(r.terminal, "step ")) << r.terminal;
  EXPECT_FALSE(Has(r.stderr_text, "step ")) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "plan: ")) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "; generated 8 tokens")) << r.stderr_text;
  ASSERT_GE(r.terminal.size(), 2u);
  EXPECT_EQ(r.terminal.substr(r.terminal.size() - 2), "\r\n") << "no final newline";
  // Only the generated text (special tokens hidden) reached the terminal.
  const nlohmann::json j = nlohmann::json::parse(test::ReadWholeFile(report));
  std::string shown = r.terminal;
  for (size_t at; (at = shown.find("\r\n")) != std::string::npos;) shown.replace(at, 2, "\n");
  EXPECT_FALSE(Has(shown, "<|")) << shown;
  EXPECT_LE(shown.size(), j["generated_text"].get<std::string>().size() + 1);
}

TEST(K3runTerminal, VerboseAddsStepLines) {
  test::TempDir tmp;
  const TtyRun r = RunOnTerminal(
      {TinyPreparedDir(), "--prompt", "hi", "--gen", "3", "--no-floor", "--verbose"}, tmp);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "step 0 (prefill")) << r.stderr_text;
  EXPECT_FALSE(Has(r.terminal, "step ")) << r.terminal;
}

// Starts k3run with stdout and stderr to files; returns its pid.
pid_t Spawn(const std::vector<std::string>& args, const std::string& out, const std::string& err) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int in = ::open("/dev/null", O_RDONLY);
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(in, 0);
    ::dup2(o, 1);
    ::dup2(e, 2);
    std::vector<std::string> owned = {K3runBinary()};
    owned.insert(owned.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : owned) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

TEST(K3runInterrupt, CtrlCEndsAPromptRunWithItsReport) {
  test::TempDir tmp;
  const std::string report = tmp.Join("r.json"), err = tmp.Join("err.txt");
  // Far more tokens than the run can make before the signal: it only ends by Ctrl-C.
  const pid_t pid = Spawn({TinyPreparedDir(), "--prompt", "hi", "--gen", "50000", "--ignore-eos",
                           "--no-floor", "--out", report},
                          tmp.Join("out.txt"), err);
  ASSERT_GT(pid, 0);
  // Wait for the plan line: the handler is installed long before it.
  for (int i = 0; i < 6000 && !Has(test::ReadWholeFile(err), "plan: "); ++i) ::usleep(10000);
  ::usleep(200000);
  ::kill(pid, SIGINT);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "ended by the signal: " << test::ReadWholeFile(err);
  EXPECT_EQ(WEXITSTATUS(status), 0) << test::ReadWholeFile(err);
  const nlohmann::json j = nlohmann::json::parse(test::ReadWholeFile(report));
  EXPECT_EQ(j["stop_reason"], "interrupted");
  EXPECT_LT(j["generated_ids"].size(), 50000u);
  EXPECT_TRUE(Has(test::ReadWholeFile(err), "interrupted (Ctrl-C)"));
}

TEST(K3runStdin, PromptFileDashAndDevStdinReadThePipe) {
  test::TempDir tmp;
  const std::string base = K3runBinary() + " '" + TinyPreparedDir() + "' --gen 0 -q --no-floor";
  ASSERT_EQ(Shell(base + " --prompt 'Hello there' --out " + tmp.Join("a.json")), 0);
  ASSERT_EQ(Shell("printf 'Hello there' | " + base + " --prompt-file - --out " +
                  tmp.Join("b.json")), 0);
  ASSERT_EQ(Shell("printf 'Hello there' | " + base + " --prompt-file /dev/stdin --out " +
                  tmp.Join("c.json")), 0);
  auto ids = [&](const char* name) {
    return nlohmann::json::parse(test::ReadWholeFile(tmp.Join(name)))["prompt_ids"];
  };
  EXPECT_EQ(ids("b.json"), ids("a.json"));
  EXPECT_EQ(ids("c.json"), ids("a.json"));
}

TEST(K3runStdin, InjectedStdinIsThePrompt) {
  CliIo io;
  io.read_stdin = []() -> Result<std::string> { return std::string("Hello there"); };
  const CliRun a = RunCliArgs({TinyPreparedDir(), "--prompt-file", "-", "--gen", "4", "-q"}, io);
  const CliRun b = RunCliArgs({TinyPreparedDir(), "--prompt", "Hello there", "--gen", "4", "-q"});
  ASSERT_EQ(a.exit_code, 0) << a.stderr_text;
  EXPECT_EQ(a.stdout_text(), b.stdout_text());
}

TEST(K3runVersion, EveryToolPrintsItsVersionWithoutArguments) {
  for (const char* tool : {"k3run/k3run", "k3prep/k3prep", "k3verify/k3verify"}) {
    test::TempDir tmp;
    const std::string out = tmp.Join("out.txt");
    const std::string name = fs::path(tool).filename().string();
    EXPECT_EQ(Shell(std::string(K3_BINARY_DIR) + "/" + tool + " --version > " + out), 0) << tool;
    EXPECT_EQ(test::ReadWholeFile(out), name + " 0.1.0\n");
  }
}

TEST(ToolFlags, QuietAndProgressBeforeOrAfterTheSubcommand) {
  test::TempDir tmp;
  const std::string k3prep = std::string(K3_BINARY_DIR) + "/k3prep/k3prep";
  const std::string synth = " synth --preset tiny --dry-run --out " + tmp.Join("x");
  EXPECT_EQ(Shell(k3prep + " --quiet --progress none" + synth + " > /dev/null"), 0);
  EXPECT_EQ(Shell(k3prep + synth + " --quiet --progress none > /dev/null"), 0);
  const std::string k3verify = std::string(K3_BINARY_DIR) + "/k3verify/k3verify";
  const std::string prepared = " prepared '" + TinyPreparedDir() + "'";
  EXPECT_EQ(Shell(k3verify + " --quiet" + prepared + " > /dev/null"), 0);
  EXPECT_EQ(Shell(k3verify + prepared + " --quiet > /dev/null"), 0);
}

TEST(K3runPrepared, MissingDirectorySaysItDoesNotExist) {
  const CliRun r = RunCliArgs({"/nonexistent/k3/prepared", "--prompt", "hi"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "/nonexistent/k3/prepared does not exist")) << r.stderr_text;
}

TEST(K3runPrepared, CheckpointDirectoryNamesThePackCommand) {
  const std::string& ck = TinyCheckpointDir();
  const CliRun r = RunCliArgs({ck, "--prompt", "hi"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "is a checkpoint")) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "k3prep pack " + ck + " --out " + ck + ".prep"))
      << r.stderr_text;
}

TEST(K3runPrepared, IncompleteDirectoriesSayWhatToRun) {
  test::TempDir tmp;
  const std::string dir = tmp.Join("prep");
  fs::copy(TinyPreparedDir(), dir, fs::copy_options::recursive);
  fs::remove(dir + "/k3.sum");
  CliRun r = RunCliArgs({dir, "--prompt", "hi"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "incomplete prepared directory (no k3.sum)")) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "k3verify prepared " + dir)) << r.stderr_text;
  // A pack stopped before k3.json: its journal is there.
  fs::remove(dir + "/k3.json");
  ASSERT_TRUE(test::WriteWholeFile(dir + "/pack-journal.k3tmp", "k3pack-journal 1 00\n"));
  r = RunCliArgs({dir, "--prompt", "hi"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "its pack did not finish")) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "--out " + dir + " --resume")) << r.stderr_text;
  // Neither prepared nor a checkpoint.
  fs::remove(dir + "/pack-journal.k3tmp");
  r = RunCliArgs({dir, "--prompt", "hi"});
  EXPECT_TRUE(Has(r.stderr_text, "is not a prepared directory (no k3.json)")) << r.stderr_text;
}

TEST(K3runPrepared, TooLongPromptNamesTheFlagUsed) {
  test::TempDir tmp;
  const std::string file = tmp.WriteFile("p.txt", "Hello");
  const CliRun r = RunCliArgs({TinyPreparedDir(), "--prompt-file", file, "--gen", "1048576"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.stderr_text, "shorten --prompt-file")) << r.stderr_text;
  EXPECT_FALSE(Has(r.stderr_text, "--ids")) << r.stderr_text;
}

}  // namespace
}  // namespace k3::run::testing
