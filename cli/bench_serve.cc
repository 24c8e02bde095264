// lazykv bench-serve: an HTTP load generator for OpenAI-compatible servers
// (`lazykv serve`, llama.cpp's llama-server, ...). `concurrency` client
// threads each keep one HTTP/1.1 connection alive. Closed loop (the default),
// each sends its next request as soon as the last one ends; open loop
// (`--request-rate`), requests arrive as a seeded Poisson process and a free
// client sends each at its arrival time. Per request it records time to first
// token, inter-token gaps and end-to-end latency, then prints one JSON summary.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/error.h"
#include "common/flags.h"

namespace lazykv {
namespace {

namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;  // keeps the output fields in a readable order

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Target {
  std::string host;
  std::string port;
  std::string base_path;  // prefix before /v1/..., usually empty
};

// Parses http://host[:port][/prefix]; a trailing /v1 is dropped so both
// "http://h:8000" and "http://h:8000/v1" work.
Target parse_url(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) throw Error(ErrorCode::kInvalidArgument, "--url must start with http://, got '" + url + "'");
  std::string rest = url.substr(scheme.size());
  Target t;
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    t.base_path = rest.substr(slash);
    rest = rest.substr(0, slash);
  }
  while (!t.base_path.empty() && t.base_path.back() == '/') t.base_path.pop_back();
  if (t.base_path.size() >= 3 && t.base_path.compare(t.base_path.size() - 3, 3, "/v1") == 0) t.base_path.resize(t.base_path.size() - 3);
  const size_t colon = rest.rfind(':');
  t.host = colon == std::string::npos ? rest : rest.substr(0, colon);
  t.port = colon == std::string::npos ? "80" : rest.substr(colon + 1);
  if (t.host.empty() || t.port.empty()) throw Error(ErrorCode::kInvalidArgument, "--url has no host or port: '" + url + "'");
  return t;
}

// A prompt of about `n` tokens: common English words are one token each in
// the usual BPE vocabularies. Each request starts at a different word so
// servers cannot answer from a cached prefix.
std::string make_prompt(int n, int64_t request_index) {
  static const char* const kWords[] = {
      "time",  "year",   "people", "way",   "day",   "man",    "thing", "woman", "life",  "child", "world", "school",
      "state", "family", "student", "group", "country", "problem", "hand", "part", "place", "case",  "week",  "company",
      "system", "program", "question", "work", "number", "night", "point", "home", "water", "room", "mother", "area",
      "money", "story",  "fact",   "month", "lot",   "right",  "study", "book",  "eye",   "job",   "word",  "business"};
  constexpr int64_t kCount = sizeof(kWords) / sizeof(kWords[0]);
  std::string prompt = "Write a story using these words:";
  const int words = std::max(1, n - 8);  // the instruction and chat template take a few tokens
  for (int i = 0; i < words; ++i) {
    prompt += ' ';
    prompt += kWords[((request_index * 7 + i) % kCount + kCount) % kCount];  // warmup indexes are negative
  }
  return prompt;
}

struct Options {
  Target target;
  std::string model;
  std::string endpoint;  // "chat" or "completions"
  int concurrency = 1;
  int64_t requests = 0;  // 0 with a duration: until the deadline
  double duration_s = 0;
  int64_t max_tokens = 0;
  int prompt_tokens_approx = 0;
  std::string prompt;
  bool stream = true;
  double temperature = 0;
  int64_t seed = 0;
  std::string api_key;
  std::optional<Json> kv_policy;
  bool ignore_eos = false;
  int64_t warmup = 0;
  double timeout_s = 600;
  double request_rate = 0;  // requests/s of the Poisson arrivals; 0: closed loop
  uint64_t arrival_seed = 1;
};

struct Result {
  bool ok = false;
  std::string error;
  bool connection_error = false;
  double ttft = 0;
  double e2e = 0;
  std::vector<double> itl;
  int64_t completion_tokens = 0;
  int64_t prompt_tokens = -1;  // from usage, -1 if the server sent none
  double start_delay = 0;  // open loop: from arrival until a client sent it
};

// Arrival times of an open-loop load: exponential gaps with mean 1/rate from
// a seeded generator, so a run can be repeated on the same schedule. The
// first request arrives at 0.
class PoissonArrivals {
 public:
  PoissonArrivals(double rate, uint64_t seed) : rng_(seed), gap_(rate) {}

  // Seconds from the start of the run to the next arrival.
  double next() {
    const double t = t_;
    t_ += gap_(rng_);
    return t;
  }

 private:
  std::mt19937_64 rng_;
  std::exponential_distribution<double> gap_;
  double t_ = 0;
};

// One keep-alive connection. Operations are asynchronous with a deadline,
// driven to completion on a private io_context, so a stuck server times out
// instead of hanging the thread.
class Client {
 public:
  explicit Client(const Options& o) : options_(o), stream_(ioc_) {}

  // Latencies count from `start`: the request's arrival, which in open loop
  // may precede the moment a client was free to send it. A retry on a new
  // connection keeps it, so the failed attempt's time counts too.
  Result send(const std::string& path, const std::string& body, Clock::time_point start) {
    for (int attempt = 0;; ++attempt) {
      const bool reused = connected_;
      got_header_ = false;
      Result r;
      try {
        if (!connected_) connect();
        http::request<http::string_body> req{http::verb::post, options_.target.base_path + path, 11};
        req.set(http::field::host, options_.target.host);
        req.set(http::field::content_type, "application/json");
        req.set(http::field::accept, options_.stream ? "text/event-stream" : "application/json");
        if (!options_.api_key.empty()) req.set(http::field::authorization, "Bearer " + options_.api_key);
        req.keep_alive(true);
        req.body() = body;
        req.prepare_payload();
        run([&](auto handler) { http::async_write(stream_, req, handler); });
        read_response(r, start);
      } catch (const beast::system_error& e) {
        close();
        // The server may close an idle keep-alive connection just as we reuse
        // it: try once more on a new one before counting an error.
        if (reused && !got_header_ && attempt == 0) continue;
        r.ok = false;
        r.connection_error = true;
        r.error = std::string("connection: ") + e.code().message();
      }
      if (!r.ok) close();
      return r;
    }
  }

  // GET for small JSON documents (the model list).
  std::string get(const std::string& path) {
    if (!connected_) connect();
    http::request<http::empty_body> req{http::verb::get, options_.target.base_path + path, 11};
    req.set(http::field::host, options_.target.host);
    if (!options_.api_key.empty()) req.set(http::field::authorization, "Bearer " + options_.api_key);
    run([&](auto handler) { http::async_write(stream_, req, handler); });
    http::response<http::string_body> res;
    run([&](auto handler) { http::async_read(stream_, buffer_, res, handler); });
    if (res.result_int() != 200) throw Error(ErrorCode::kIo, "GET " + path + ": HTTP " + std::to_string(res.result_int()));
    return res.body();
  }

 private:
  // Starts one asynchronous operation and runs the io_context until it ends.
  template <typename Start>
  void run(Start&& start) {
    beast::error_code result;
    stream_.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.timeout_s)));
    start([&result](beast::error_code ec, auto&&...) { result = ec; });
    ioc_.restart();
    ioc_.run();
    if (result && result != http::error::need_buffer) throw beast::system_error(result);
  }

  void connect() {
    tcp::resolver resolver(ioc_);
    const auto endpoints = resolver.resolve(options_.target.host, options_.target.port);
    run([&](auto handler) { stream_.async_connect(endpoints, handler); });
    stream_.socket().set_option(tcp::no_delay(true));
    buffer_.clear();
    connected_ = true;
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
    connected_ = false;
  }

  void read_response(Result& r, Clock::time_point start) {
    http::response_parser<http::buffer_body> parser;
    // A huge limit rather than boost::none: Boost 1.74 compares Content-Length
    // with an empty optional and rejects every sized body.
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    run([&](auto handler) { http::async_read_header(stream_, buffer_, parser, handler); });
    got_header_ = true;
    const int status = parser.get().result_int();
    std::string body;  // whole body when not streaming or on an error status
    std::string pending;  // SSE bytes not yet split into events
    bool done_marker = false;
    int64_t content_chunks = 0;
    Clock::time_point last_token{};
    std::string stream_error;
    char chunk[16384];
    while (!parser.is_done()) {
      parser.get().body().data = chunk;
      parser.get().body().size = sizeof(chunk);
      run([&](auto handler) { http::async_read_some(stream_, buffer_, parser, handler); });
      const size_t n = sizeof(chunk) - parser.get().body().size;
      if (n == 0) continue;
      const Clock::time_point now = Clock::now();
      if (status != 200 || !options_.stream) {
        body.append(chunk, n);
        continue;
      }
      for (size_t i = 0; i < n; ++i) {
        if (chunk[i] != '\r') pending += chunk[i];
      }
      size_t end;
      while ((end = pending.find("\n\n")) != std::string::npos) {
        const std::string event = pending.substr(0, end);
        pending.erase(0, end + 2);
        std::string data;  // the event's data lines joined
        size_t pos = 0;
        while (pos < event.size()) {
          size_t eol = event.find('\n', pos);
          if (eol == std::string::npos) eol = event.size();
          const std::string line = event.substr(pos, eol - pos);
          if (line.rfind("data:", 0) == 0) data += line.substr(line.size() > 5 && line[5] == ' ' ? 6 : 5);
          pos = eol + 1;
        }
        if (data.empty()) continue;
        if (data == "[DONE]") {
          done_marker = true;
          continue;
        }
        const Json j = Json::parse(data, nullptr, false);
        if (j.is_discarded() || !j.is_object()) {
          if (stream_error.empty()) stream_error = "malformed SSE event: " + data.substr(0, 200);
          continue;
        }
        if (j.contains("error")) {
          if (stream_error.empty()) stream_error = "error event: " + j["error"].dump().substr(0, 300);
          continue;
        }
        if (j.contains("usage") && j["usage"].is_object()) read_usage(j["usage"], r);
        if (has_content(j)) {
          if (content_chunks == 0) {
            r.ttft = seconds_between(start, now);
          } else {
            r.itl.push_back(seconds_between(last_token, now));
          }
          last_token = now;
          ++content_chunks;
        }
      }
    }
    const Clock::time_point end_time = Clock::now();
    r.e2e = seconds_between(start, end_time);
    if (!parser.keep_alive()) close();
    if (status != 200) {
      r.error = "HTTP " + std::to_string(status) + ": " + body.substr(0, 300);
      return;
    }
    if (!options_.stream) {
      const Json j = Json::parse(body, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("choices")) {
        r.error = "malformed response: " + body.substr(0, 200);
        return;
      }
      if (j.contains("usage") && j["usage"].is_object()) read_usage(j["usage"], r);
      r.ttft = r.e2e;  // without streaming the first token arrives with the last
      r.ok = true;
      return;
    }
    if (!stream_error.empty()) {
      r.error = stream_error;
    } else if (!done_marker) {
      r.error = "stream ended without data: [DONE]";
    } else {
      if (r.completion_tokens == 0) r.completion_tokens = content_chunks;
      r.ok = true;
    }
  }

  static void read_usage(const Json& usage, Result& r) {
    if (usage.contains("completion_tokens") && usage["completion_tokens"].is_number_integer())
      r.completion_tokens = usage["completion_tokens"].get<int64_t>();
    if (usage.contains("prompt_tokens") && usage["prompt_tokens"].is_number_integer())
      r.prompt_tokens = usage["prompt_tokens"].get<int64_t>();
  }

  // Whether a stream chunk carries generated text (answer or reasoning).
  static bool has_content(const Json& j) {
    const auto choices = j.find("choices");
    if (choices == j.end() || !choices->is_array()) return false;
    for (const Json& c : *choices) {
      if (c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty()) return true;
      const auto delta = c.find("delta");
      if (delta == c.end() || !delta->is_object()) continue;
      for (const char* field : {"content", "reasoning_content"}) {
        const auto v = delta->find(field);
        if (v != delta->end() && v->is_string() && !v->get<std::string>().empty()) return true;
      }
    }
    return false;
  }

  const Options& options_;
  net::io_context ioc_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  bool connected_ = false;
  bool got_header_ = false;  // of the response being read
};

std::string request_body(const Options& o, int64_t request_index) {
  const std::string prompt = o.prompt.empty() ? make_prompt(o.prompt_tokens_approx, request_index) : o.prompt;
  Json body = {{"model", o.model}, {"max_tokens", o.max_tokens}, {"temperature", o.temperature},
               {"seed", o.seed},   {"stream", o.stream}};
  if (o.endpoint == "chat") {
    body["messages"] = Json::array({{{"role", "user"}, {"content", prompt}}});
  } else {
    body["prompt"] = prompt;
  }
  if (o.stream) body["stream_options"] = {{"include_usage", true}};
  if (o.kv_policy) body["kv_policy"] = *o.kv_policy;
  if (o.ignore_eos) body["ignore_eos"] = true;
  return body.dump();
}

// Nearest-rank percentile of sorted samples.
double percentile(const std::vector<double>& sorted, double p) {
  const size_t rank = size_t(std::max(1.0, std::ceil(p / 100.0 * double(sorted.size()))));
  return sorted[std::min(rank, sorted.size()) - 1];
}

Json summarize(std::vector<double> samples, std::initializer_list<int> ps, bool with_mean) {
  Json out = Json::object();
  std::sort(samples.begin(), samples.end());
  for (int p : ps) out["p" + std::to_string(p)] = samples.empty() ? Json(nullptr) : Json(percentile(samples, p));
  out["max"] = samples.empty() ? Json(nullptr) : Json(samples.back());  // the worst a client saw
  if (with_mean) {
    out["mean"] = samples.empty() ? Json(nullptr)
                                  : Json(std::accumulate(samples.begin(), samples.end(), 0.0) / double(samples.size()));
  }
  return out;
}

Options parse_options(const std::vector<std::string>& args, bool& help) {
  Flags flags("bench-serve");
  flags.add("url", "http://127.0.0.1:8000", "server base URL (http only)")
      .add("model", "", "model name sent in requests; default: the first id of GET /v1/models")
      .add("endpoint", "chat", "chat (/v1/chat/completions) or completions (/v1/completions)")
      .add("concurrency", "8", "client threads, one keep-alive connection each")
      .add("requests", "64", "requests in total (ignored when --duration is given)")
      .add("duration", "0", "seconds to keep starting requests (those in flight then finish) instead of a fixed count; 0: use --requests")
      .add("max-tokens", "64", "max_tokens of each request")
      .add("prompt-tokens-approx", "128", "prompt length in tokens, roughly (built from a fixed word list)")
      .add("prompt", "", "fixed prompt text instead of a generated one")
      .add_switch("stream", "stream responses (SSE); the default")
      .add_switch("no-stream", "wait for whole responses; TTFT is then the end-to-end latency")
      .add("temperature", "0", "sampling temperature")
      .add("seed", "1", "sampling seed")
      .add("api-key", "", "sent as 'Authorization: Bearer KEY'")
      .add("kv-policy", "", "JSON object sent as the request field kv_policy, e.g. '{\"name\":\"lazy\",\"budget\":512}'")
      .add_switch("ignore-eos",
                  "send \"ignore_eos\": true (honoured by lazykv, llama-server and vLLM): every request "
                  "generates exactly max_tokens, so servers are compared on the same output lengths")
      .add("request-rate", "0",
           "open loop: requests per second arriving as a Poisson process, each sent by a free client (latencies "
           "count from its arrival, so a saturated --concurrency shows); 0: closed loop, back to back")
      .add("arrival-seed", "1", "seed of the Poisson arrival times")
      .add("warmup", "0", "requests sent one at a time before measuring (not counted)")
      .add("timeout", "600", "seconds one network operation may take before the request counts as failed");
  flags.parse(args);
  help = flags.help_requested();
  if (help) {
    std::fputs(flags.usage().c_str(), stdout);
    return {};
  }
  auto bad = [](const std::string& message) { return Error(ErrorCode::kInvalidArgument, message); };
  Options o;
  o.target = parse_url(flags.get("url"));
  o.model = flags.get("model");
  o.endpoint = flags.get("endpoint");
  if (o.endpoint != "chat" && o.endpoint != "completions") throw bad("--endpoint must be chat or completions");
  o.concurrency = int(flags.get_int("concurrency"));
  if (o.concurrency < 1 || o.concurrency > 4096) throw bad("--concurrency must be in [1, 4096]");
  o.duration_s = flags.get_double("duration");
  if (o.duration_s < 0) throw bad("--duration must be >= 0");
  o.requests = o.duration_s > 0 ? 0 : flags.get_int("requests");
  if (o.duration_s == 0 && o.requests < 1) throw bad("--requests must be >= 1");
  o.max_tokens = flags.get_int("max-tokens");
  if (o.max_tokens < 1) throw bad("--max-tokens must be >= 1");
  o.prompt_tokens_approx = int(flags.get_int("prompt-tokens-approx"));
  if (o.prompt_tokens_approx < 1) throw bad("--prompt-tokens-approx must be >= 1");
  o.prompt = flags.get("prompt");
  o.stream = !flags.get_bool("no-stream") && !(flags.is_set("stream") && !flags.get_bool("stream"));
  o.temperature = flags.get_double("temperature");
  o.seed = flags.get_int("seed");
  o.api_key = flags.get("api-key");
  if (!flags.get("kv-policy").empty()) {
    Json policy = Json::parse(flags.get("kv-policy"), nullptr, false);
    if (policy.is_discarded() || !policy.is_object()) throw bad("--kv-policy must be a JSON object");
    o.kv_policy = policy;
  }
  o.ignore_eos = flags.get_bool("ignore-eos");
  o.warmup = flags.get_int("warmup");
  if (o.warmup < 0) throw bad("--warmup must be >= 0");
  o.timeout_s = flags.get_double("timeout");
  if (o.timeout_s <= 0) throw bad("--timeout must be > 0");
  o.request_rate = flags.get_double("request-rate");
  if (!std::isfinite(o.request_rate) || o.request_rate < 0 || (o.request_rate > 0 && o.request_rate < 1e-3)) {
    throw bad("--request-rate must be 0 (closed loop) or from 0.001 to a finite number of requests per second");
  }
  o.arrival_seed = uint64_t(flags.get_int("arrival-seed"));
  return o;
}

}  // namespace

int run_bench_serve(const std::vector<std::string>& args) {
  bool help = false;
  Options o = parse_options(args, help);
  if (help) return 0;
  const std::string path = o.endpoint == "chat" ? "/v1/chat/completions" : "/v1/completions";

  if (o.model.empty()) {
    Client probe(o);
    try {
      const Json models = Json::parse(probe.get("/v1/models"));
      o.model = models.at("data").at(0).at("id").get<std::string>();
    } catch (const std::exception& e) {
      throw Error(ErrorCode::kIo, std::string("--model not given and GET /v1/models failed: ") + e.what());
    }
  }
  if (o.warmup > 0) {
    Client client(o);
    for (int64_t i = 0; i < o.warmup; ++i) {
      const Result r = client.send(path, request_body(o, -1 - i), Clock::now());
      if (!r.ok) std::fprintf(stderr, "bench-serve: warmup request failed: %s\n", r.error.c_str());
    }
  }

  auto after = [](Clock::time_point t, double seconds) {
    return t + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  };
  std::mutex mu;  // guards everything below that the clients share
  std::vector<Result> results;
  int64_t next_index = 0;
  std::optional<PoissonArrivals> arrivals;
  if (o.request_rate > 0) arrivals.emplace(o.request_rate, o.arrival_seed);
  double last_arrival_s = 0;
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = after(start, o.duration_s);
  auto worker = [&]() {
    Client client(o);
    for (;;) {
      int64_t index;
      Clock::time_point arrival;
      {
        std::lock_guard<std::mutex> lock(mu);
        index = next_index++;
        const double offset = arrivals ? arrivals->next() : seconds_between(start, Clock::now());
        arrival = after(start, offset);
        if (o.duration_s > 0 ? arrival >= deadline : index >= o.requests) break;
        last_arrival_s = std::max(last_arrival_s, offset);
      }
      std::this_thread::sleep_until(arrival);
      const double start_delay = seconds_between(arrival, Clock::now());
      Result r = client.send(path, request_body(o, index), arrival);
      r.start_delay = start_delay;
      // A refused connection fails at once; pause so a dead server is not spun on.
      if (r.connection_error && o.duration_s > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      std::lock_guard<std::mutex> lock(mu);
      results.push_back(std::move(r));
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < o.concurrency; ++i) threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  const double duration = seconds_between(start, Clock::now());

  std::vector<double> ttft, itl, e2e, start_delays;
  std::vector<std::string> error_samples;
  int64_t errors = 0, output_tokens = 0, prompt_tokens_sum = 0, prompt_tokens_n = 0;
  for (const Result& r : results) {
    start_delays.push_back(r.start_delay);
    if (!r.ok) {
      ++errors;
      if (error_samples.size() < 5) error_samples.push_back(r.error);
      continue;
    }
    ttft.push_back(r.ttft);
    e2e.push_back(r.e2e);
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
    output_tokens += r.completion_tokens;
    if (r.prompt_tokens >= 0) {
      prompt_tokens_sum += r.prompt_tokens;
      ++prompt_tokens_n;
    }
  }
  const int64_t completed = int64_t(results.size()) - errors;
  Json out = {{"url", "http://" + o.target.host + ":" + o.target.port + o.target.base_path},
              {"model", o.model},
              {"endpoint", o.endpoint},
              {"stream", o.stream},
              {"concurrency", o.concurrency},
              {"max_tokens", o.max_tokens},
              {"requests", int64_t(results.size())},
              {"errors", errors},
              {"error_samples", error_samples},
              {"duration_s", duration},
              {"output_tokens", output_tokens},
              {"output_tokens_per_s", duration > 0 ? double(output_tokens) / duration : 0.0},
              {"requests_per_s", duration > 0 ? double(completed) / duration : 0.0},
              {"ttft_s", summarize(ttft, {50, 90, 99}, true)},
              {"itl_s", summarize(itl, {50, 90, 99}, true)},
              {"e2e_s", summarize(e2e, {50, 99}, false)},
              {"prompt_tokens_mean",
               prompt_tokens_n > 0 ? Json(double(prompt_tokens_sum) / double(prompt_tokens_n)) : Json(nullptr)},
              {"arrival", arrivals ? "poisson" : "closed"},
              {"request_rate", arrivals ? Json(o.request_rate) : Json(nullptr)}};
  if (arrivals) {
    out["arrival_seed"] = o.arrival_seed;
    out["last_arrival_s"] = last_arrival_s;
    // Large delays mean every client was busy: the load was capped by
    // --concurrency, not by the rate.
    out["start_delay_s"] = summarize(start_delays, {50, 99}, true);
  }
  std::printf("%s\n", out.dump(2).c_str());
  return errors == 0 ? 0 : 1;
}

}  // namespace lazykv
