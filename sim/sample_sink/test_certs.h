// Test certificates for TLS between Handoff's EventSink client and the sample sink, made
// with the `openssl` command line (scripts/setup installs it) into a test's directory.
//
// Every certificate lasts two days and has a P-256 key; the keys are unencrypted PEM
// (PKCS#8) except `encrypted_key`. Paths are absolute.
#ifndef HANDOFF_SIM_SAMPLE_SINK_TEST_CERTS_H_
#define HANDOFF_SIM_SAMPLE_SINK_TEST_CERTS_H_

#include <string>

#include "absl/status/statusor.h"

namespace handoff::sim {

struct TestCerts {
  // The sink's CA, and the sink's certificate it signed, for localhost and 127.0.0.1.
  std::string ca;
  std::string server_cert;
  std::string server_key;
  // A sink certificate from the same CA for the name "sink.handoff.test" only.
  std::string named_server_cert;
  std::string named_server_key;
  // An unrelated CA: verifies none of these certificates.
  std::string other_ca;
  // The CA the sink trusts for clients, and a client certificate it signed.
  std::string client_ca;
  std::string client_cert;
  std::string client_key;
  // A client certificate signed by `other_ca`: one the sink does not trust.
  std::string stranger_cert;
  std::string stranger_key;
  // `client_key` encrypted with a passphrase.
  std::string encrypted_key;
};

// Makes the files under `dir` (created if missing). INTERNAL when openssl fails.
absl::StatusOr<TestCerts> MakeTestCerts(const std::string& dir);

// The whole file at `path` ("" when unreadable).
std::string ReadTestFile(const std::string& path);

}  // namespace handoff::sim

#endif  // HANDOFF_SIM_SAMPLE_SINK_TEST_CERTS_H_
