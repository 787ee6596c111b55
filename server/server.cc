#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "base/thread_name.h"
#include "server/sources_config.h"

namespace handoff::server {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::FailedPreconditionError(absl::StrCat(flag, ": cannot read ", path));
  std::stringstream content;
  content << in.rdbuf();
  return content.str();
}

// TLS (optionally mutual) from PEM files, or insecure credentials without them.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeCredentials(
    const ServerOptions& options) {
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("tls_cert, tls_key: set both or neither");
  }
  if (options.tls_cert.empty()) {
    if (!options.tls_client_ca.empty()) {
      return absl::InvalidArgumentError("tls_client_ca: needs tls_cert and tls_key");
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.cert_chain, ReadFile("tls_cert", options.tls_cert));
  ASSIGN_OR_RETURN(pair.private_key, ReadFile("tls_key", options.tls_key));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!options.tls_client_ca.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFile("tls_client_ca", options.tls_client_ca));
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

absl::Status ValidateOptions(const ServerOptions& options) {
  if (options.data_dir.empty()) return absl::InvalidArgumentError("data_dir: required");
  if (options.listen.empty()) return absl::InvalidArgumentError("listen: required");
  if (!options.source_manager_factory) {
    return absl::InvalidArgumentError("source_manager_factory: required");
  }
  if (options.insecure_disable_auth && !options.auth_tokens_file.empty()) {
    return absl::InvalidArgumentError(
        "auth_tokens_file, insecure_disable_auth: choose one");
  }
  if (!options.insecure_disable_auth && options.auth_tokens_file.empty()) {
    return absl::InvalidArgumentError(
        "auth_tokens_file: required (or --insecure_disable_auth, for development only)");
  }
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError("max_message_bytes: must be positive");
  }
  if (options.max_watchers <= 0) return absl::InvalidArgumentError("max_watchers: must be positive");
  if (options.max_sources <= 0) return absl::InvalidArgumentError("max_sources: must be positive");
  if (options.shutdown_grace <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("shutdown_grace: must be positive");
  }
  if (options.health_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("health_interval: must be positive");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::BuildAndStart(ServerOptions options) {
  // Before any thread exists: every thread created below inherits the blocked mask.
  if (options.handle_signals) BlockTerminationSignals();
  std::unique_ptr<Server> server(new Server(std::move(options)));
  const absl::Status built = server->Build();
  if (!built.ok()) {
    server->logger_->Error("start-up failed", {{"code", absl::StatusCodeToString(built.code())},
                                               {"error", built.message()}});
    return built;  // ~Server undoes what was built
  }
  return server;
}

Server::Server(ServerOptions options) : options_(std::move(options)) {
  logger_ = options_.log_writer ? std::make_unique<Logger>(options_.log_level, options_.log_writer)
                                : std::make_unique<Logger>(options_.log_level);
  RouteGrpcLogsTo(logger_.get());
}

absl::Status Server::Build() {
  RETURN_IF_ERROR(ValidateOptions(options_));

  // Everything that can be checked without the database is checked first.
  if (options_.insecure_disable_auth) {
    auth_ = Authenticator::Disabled();
    logger_->Warning(
        "authentication DISABLED (--insecure_disable_auth): every caller is an operator; "
        "never run this way outside development");
  } else {
    ASSIGN_OR_RETURN(auth_, Authenticator::FromFile(options_.auth_tokens_file));
  }
  handoff::v1::SourcesConfig declared;
  if (!options_.sources_config.empty()) {
    ASSIGN_OR_RETURN(declared, LoadSourcesConfig(options_.sources_config));
  }

  std::error_code error;
  std::filesystem::create_directories(options_.data_dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("data_dir: cannot create ", options_.data_dir, ": ", error.message()));
  }
  store::StoreOptions store_options;
  store_options.path = options_.data_dir + "/db";
  store_options.write_buffer_bytes = options_.write_buffer_bytes;
  store_options.block_cache_bytes = options_.block_cache_bytes;
  store_options.wal_sync_interval = options_.wal_sync_interval;
  ASSIGN_OR_RETURN(store_, store::Store::Open(store_options));
  logger_->Info("database open",
                {{"path", store_options.path},
                 {"memory_ceiling_mib",
                  absl::StrCat(store::StoreMemoryCeiling(store_options) >> 20)},
                 {"page_slots", options_.factories.page_budget != nullptr
                                    ? absl::StrCat(options_.factories.page_budget->slots())
                                    : "uncapped"},
                 {"max_page_bytes", absl::StrCat(options_.max_page_bytes)}});

  registry_ = std::make_shared<prometheus::Registry>();
  metrics_observer_ = std::make_unique<MetricsObserver>(registry_.get());
  logging_observer_ = std::make_unique<LoggingObserver>(logger_.get());
  observer_ = std::make_unique<FanOutObserver>(std::vector<consumer::EngineObserver*>{
      metrics_observer_.get(), logging_observer_.get()});

  consumer::SourceManagerOptions manager_options;
  manager_options.store = store_.get();
  manager_options.factories = options_.factories;
  manager_options.observer = observer_.get();
  manager_options.max_sources = options_.max_sources;
  manager_options.worker = options_.worker;
  manager_options.stop_timeout = options_.shutdown_grace / 2;
  ASSIGN_OR_RETURN(manager_, options_.source_manager_factory(std::move(manager_options)));
  RETURN_IF_ERROR(manager_->Recover());
  RETURN_IF_ERROR(ApplySourcesConfig(declared, manager_.get(), logger_.get()));

  const std::vector<ThreadInfo> threads_before_grpc = ListThreads();
  RETURN_IF_ERROR(StartGrpc());

  RETURN_IF_ERROR(StartHealthServer());
  // Every gRPC thread that waits for network events may read an admin request, not only
  // the one that answers it (admin_call_scheduling.h).
  const AdminCallScheduling& call_scheduling = admin_service_->call_scheduling();
  const absl::StatusOr<int> raised =
      // Each new thread names itself when it first runs; on a loaded machine that can take
      // seconds, and one not yet named would stay at normal priority for good.
      call_scheduling.RaiseGrpcPollerThreads(threads_before_grpc, absl::Seconds(10));
  if (!raised.ok()) {
    logger_->Warning("gRPC's polling threads run at normal priority",
                     {{"reason", std::string(raised.status().message())}});
  }

  store::Store* store = store_.get();
  auto store_health = [store] { return store->health(); };
  std::vector<grpc::HealthCheckServiceInterface*> health_services = {
      grpc_server_->GetHealthCheckService()};
  if (health_server_ != nullptr) {
    health_services.push_back(health_server_->GetHealthCheckService());
  }
  health_ = std::make_unique<HealthReporter>(std::move(health_services), manager_.get(), store_health, logger_.get(),
                                             options_.health_interval);
  health_->Start();

  if (!options_.metrics_listen.empty()) {
    progress_collector_ = std::make_shared<ProgressCollector>(
        manager_.get(), store_health, [store] { return store->memory_usage(); },
        options_.factories.page_budget);
    ASSIGN_OR_RETURN(metrics_, MetricsEndpoint::Start(options_.metrics_listen,
                                                      {registry_, progress_collector_}));
  }

  RETURN_IF_ERROR(WritePortFile());
  if (options_.handle_signals) {
    signals_ = std::make_unique<SignalWatcher>([this](int signo) {
      logger_->Info("termination signal: shutting down", {{"signal", absl::StrCat(signo)}});
      RequestShutdown();
    });
  }
  logger_->Info("serving", {{"port", absl::StrCat(port_)},
                            {"admin_threads", call_scheduling.Describe()},
                            {"grpc_pollers_realtime", absl::StrCat(raised.value_or(0))},
                            {"metrics_port", absl::StrCat(metrics_port())},
                            {"tls", options_.tls_cert.empty() ? "off" : "on"},
                            {"mtls", options_.tls_client_ca.empty() ? "off" : "on"},
                            {"auth", auth_->enabled() ? "tokens" : "disabled"}});
  return absl::OkStatus();
}

absl::Status Server::StartGrpc() {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   MakeCredentials(options_));
  if (options_.tls_cert.empty() && auth_->enabled()) {
    logger_->Warning("TLS is off: bearer tokens travel in clear text");
  }
  AdminServiceOptions admin_options;
  admin_options.max_watchers = options_.max_watchers;
  admin_options.call_scheduling = AdminCallScheduling::Create(options_.admin_realtime_priority);
  if (!admin_options.call_scheduling.status().ok()) {
    logger_->Warning("admin calls run at normal priority: their latency under full ingest "
                     "waits for the workers' time slices",
                     {{"reason", std::string(admin_options.call_scheduling.status().message())}});
  }
  admin_service_ = std::make_unique<AdminService>(manager_.get(), auth_.get(), admin_options);

  // Process-wide switches, read by the builder; both are idempotent.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.listen, credentials, &port_);
  builder.RegisterService(admin_service_.get());
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
  // gRPC sets SO_REUSEPORT by default: a second handoffd on the same port would then
  // share it silently. Refuse instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // The sync server runs each call on a thread of its pool; a stream holds its thread.
  // The quota must leave room for every watcher plus unary calls, or calls beyond it are
  // refused with RESOURCE_EXHAUSTED.
  grpc::ResourceQuota quota("handoffd");
  quota.SetMaxThreads(options_.max_watchers + 64);
  builder.SetResourceQuota(quota);
  grpc_server_ = builder.BuildAndStart();
  if (grpc_server_ == nullptr || port_ == 0) {
    return absl::UnavailableError(absl::StrCat("listen: cannot serve on ", options_.listen));
  }
  return absl::OkStatus();
}

absl::Status Server::StartHealthServer() {
  if (options_.health_listen.empty()) return absl::OkStatus();
  // Only the default health service (enabled in StartGrpc) is served here, in
  // plaintext: what the kubelet's gRPC probe can reach.
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.health_listen, grpc::InsecureServerCredentials(),
                           &health_port_);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  health_server_ = builder.BuildAndStart();
  if (health_server_ == nullptr || health_port_ == 0 ||
      health_server_->GetHealthCheckService() == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("health_listen: cannot serve on ", options_.health_listen));
  }
  return absl::OkStatus();
}

absl::Status Server::WritePortFile() const {
  if (options_.port_file.empty()) return absl::OkStatus();
  std::string content = absl::StrCat("grpc ", port_, "\n");
  if (metrics_ != nullptr) absl::StrAppend(&content, "metrics ", metrics_->port(), "\n");
  if (health_server_ != nullptr) absl::StrAppend(&content, "health ", health_port_, "\n");
  const std::string temp = options_.port_file + ".tmp";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << content;
    out.close();
    if (!out) return absl::FailedPreconditionError(absl::StrCat("port_file: cannot write ", temp));
  }
  if (std::rename(temp.c_str(), options_.port_file.c_str()) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("port_file: cannot rename to ", options_.port_file));
  }
  return absl::OkStatus();
}

void Server::WaitForTermination() {
  shutdown_requested_.WaitForNotification();
  Shutdown();
}

void Server::RequestShutdown() {
  absl::MutexLock lock(&shutdown_mu_);
  if (!shutdown_requested_.HasBeenNotified()) shutdown_requested_.Notify();
}

void Server::Shutdown() {
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  const absl::Time start = absl::Now();
  auto step = [&](absl::string_view name) {
    logger_->Debug("shutdown step done",
                   {{"step", name},
                    {"elapsed_ms", absl::StrCat(absl::ToInt64Milliseconds(absl::Now() - start))}});
  };
  if (health_ != nullptr) health_->Stop();  // 1
  if (health_server_ != nullptr) {
    health_server_->Shutdown(absl::ToChronoTime(absl::Now()));
    health_server_->Wait();
  }
  step("health not serving");
  if (admin_service_ != nullptr) admin_service_->BeginShutdown();  // 2
  if (grpc_server_ != nullptr) {                                   // 3
    grpc_server_->Shutdown(absl::ToChronoTime(absl::Now() + options_.shutdown_grace / 4));
    grpc_server_->Wait();
  }
  step("grpc stopped");
  metrics_.reset();  // 4
  step("metrics stopped");
  std::vector<std::string> abandoned;
  if (manager_ != nullptr) {  // 5
    abandoned = manager_->ShutdownBy(start + options_.shutdown_grace * 7 / 8);
    if (abandoned.empty()) manager_.reset();  // 6
  }
  step("workers stopped");
  if (!abandoned.empty()) {
    // Their threads may still use the store, the observers and the manager: none is
    // destroyed. The process exits without closing the store (main.cc), as after a crash,
    // which the next start recovers from.
    logger_->Error(
        "workers did not stop within --shutdown_grace: abandoned; the store stays open under "
        "them and handoffd exits without closing it",
        {{"sources", absl::StrJoin(abandoned, ",")},
         {"shutdown_grace_ms", absl::StrCat(absl::ToInt64Milliseconds(options_.shutdown_grace))}});
    absl::MutexLock lock(&shutdown_mu_);
    abandoned_sources_ = abandoned;
  }
  if (store_ != nullptr) {
    // Also under abandoned workers: what the memtables hold reaches the disk now (RocksDB
    // takes a flush beside running writers), so the next start has less to replay.
    const absl::Status flushed = store_->Flush();
    if (!flushed.ok()) {
      logger_->Error("store flush at shutdown failed", {{"error", flushed.message()}});
    }
    if (abandoned.empty()) store_.reset();
  }
  step(abandoned.empty() ? "store closed" : "store flushed, left open");
  logger_->Info("stopped",
                {{"shutdown_ms", absl::StrCat(absl::ToInt64Milliseconds(absl::Now() - start))}});
}

std::vector<std::string> Server::abandoned_sources() const {
  absl::MutexLock lock(&shutdown_mu_);
  return abandoned_sources_;
}

Server::~Server() {
  Shutdown();
  signals_.reset();
  RouteGrpcLogsTo(nullptr);
}

}  // namespace handoff::server
