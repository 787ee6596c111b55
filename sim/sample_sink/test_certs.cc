#include "sim/sample_sink/test_certs.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace handoff::sim {
namespace {

// Runs `command` with its output sent to `log`.
absl::Status Run(const std::string& command, const std::string& log) {
  const std::string line = absl::StrCat(command, " >>", log, " 2>&1");
  if (std::system(line.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("failed (see ", log, "): ", command));
  }
  return absl::OkStatus();
}

// A new P-256 key at `key` and a certificate for `subject` at `cert`: self-signed as a
// CA when `issuer` is empty, else signed by the CA `issuer` (.pem, with its .key) with
// the extensions `ext`.
absl::Status MakeCert(const std::string& dir, const std::string& name, const std::string& subject,
                      const std::string& issuer, const std::string& ext, int serial) {
  const std::string log = dir + "/openssl.log";
  const std::string base = absl::StrCat(dir, "/", name);
  const std::string new_key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  if (issuer.empty()) {
    return Run(absl::StrCat("openssl req -x509 ", new_key, " -keyout ", base, ".key -out ", base,
                            ".pem -days 2 -subj ", subject,
                            " -addext basicConstraints=critical,CA:TRUE",
                            " -addext keyUsage=critical,keyCertSign,cRLSign"),
               log);
  }
  if (absl::Status s = Run(absl::StrCat("openssl req ", new_key, " -keyout ", base, ".key -out ",
                                        base, ".csr -subj ", subject),
                           log);
      !s.ok()) {
    return s;
  }
  {
    std::ofstream out(base + ".ext");
    out << ext;
  }
  const std::string ca = absl::StrCat(dir, "/", issuer);
  return Run(absl::StrCat("openssl x509 -req -in ", base, ".csr -CA ", ca, ".pem -CAkey ", ca,
                          ".key -set_serial ", serial, " -days 2 -out ", base, ".pem -extfile ",
                          base, ".ext"),
             log);
}

}  // namespace

absl::StatusOr<TestCerts> MakeTestCerts(const std::string& dir) {
  mkdir(dir.c_str(), 0700);
  const std::string server_ext = "extendedKeyUsage=serverAuth\n";
  const std::string client_ext = "extendedKeyUsage=clientAuth\n";
  struct Step {
    const char* name;
    const char* subject;
    const char* issuer;
    std::string ext;
  };
  const Step steps[] = {
      {"ca", "/CN=handoff-test-sink-ca", "", ""},
      {"server", "/CN=localhost", "ca",
       server_ext + "subjectAltName=DNS:localhost,IP:127.0.0.1\n"},
      {"named-server", "/CN=sink.handoff.test", "ca",
       server_ext + "subjectAltName=DNS:sink.handoff.test\n"},
      {"other-ca", "/CN=handoff-test-other-ca", "", ""},
      {"client-ca", "/CN=handoff-test-client-ca", "", ""},
      {"client", "/CN=handoff-test-client", "client-ca", client_ext},
      {"stranger", "/CN=handoff-test-stranger", "other-ca", client_ext},
  };
  int serial = 1;
  for (const Step& step : steps) {
    absl::Status s = MakeCert(dir, step.name, step.subject, step.issuer, step.ext, serial++);
    if (!s.ok()) return s;
  }
  TestCerts certs;
  auto path = [&](const char* name) { return absl::StrCat(dir, "/", name); };
  certs.ca = path("ca.pem");
  certs.server_cert = path("server.pem");
  certs.server_key = path("server.key");
  certs.named_server_cert = path("named-server.pem");
  certs.named_server_key = path("named-server.key");
  certs.other_ca = path("other-ca.pem");
  certs.client_ca = path("client-ca.pem");
  certs.client_cert = path("client.pem");
  certs.client_key = path("client.key");
  certs.stranger_cert = path("stranger.pem");
  certs.stranger_key = path("stranger.key");
  certs.encrypted_key = path("client-encrypted.key");
  absl::Status s = Run(absl::StrCat("openssl pkcs8 -topk8 -v2 aes-128-cbc -in ", certs.client_key,
                                    " -out ", certs.encrypted_key, " -passout pass:hunter2"),
                       path("openssl.log"));
  if (!s.ok()) return s;
  return certs;
}

std::string ReadTestFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace handoff::sim
