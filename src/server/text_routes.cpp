// The small endpoints users script against, in llama.cpp's shapes: POST /tokenize,
// POST /detokenize, POST /apply-template and GET /props.
#include "core/version.h"
#include "server/request_json.h"
#include "server/routes.h"

#include <fmt/format.h>

namespace swiftlet::server {

Reply Routes::tokenize(std::string_view body) const {
  const json j = parse_json_body(body);
  auto content = get_string(j, "content");
  if (!content) missing("content");
  // Qwen adds no BOS/EOS, so add_special changes nothing; parse_special: <|im_start|> and the
  // other special tokens as one id each (default) or as plain text.
  get_bool(j, "add_special");
  const bool parse_special = get_bool(j, "parse_special").value_or(true);
  const bool with_pieces = get_bool(j, "with_pieces").value_or(false);
  const Tokenizer& tok = ready_engine().require_tokenizer();
  const std::vector<int32_t> ids = tok.encode(*content, parse_special);
  json tokens = json::array();
  for (int32_t id : ids) {
    if (!with_pieces) {
      tokens.push_back(id);
      continue;
    }
    // A piece that is not whole UTF-8 (part of a character) is given as its bytes.
    const std::string_view bytes = tok.token_bytes(id);
    json piece = json(std::string(bytes));
    if (tok.decode(std::span(&id, 1)) != bytes) {
      piece = json::array();
      for (char c : bytes) piece.push_back(int(static_cast<unsigned char>(c)));
    }
    tokens.push_back({{"id", id}, {"piece", std::move(piece)}});
  }
  Reply r;
  r.body = json{{"tokens", std::move(tokens)}}.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

Reply Routes::detokenize(std::string_view body) const {
  const json j = parse_json_body(body);
  const json* t = field(j, "tokens");
  if (!t) missing("tokens");
  if (!t->is_array()) wrong_type("tokens", "an array of token ids", *t);
  const Engine& engine = ready_engine();
  std::vector<int32_t> ids;
  for (size_t i = 0; i < t->size(); ++i) {
    const json& v = (*t)[i];
    const std::string p = fmt::format("tokens[{}]", i);
    if (!v.is_number_integer()) wrong_type(p, "an integer token id", v);
    const int64_t vocab = engine.config().vocab_size;
    if (!integer_within(v, 0, vocab - 1))
      bad_value(p, fmt::format("token id {} is outside the vocabulary of {} tokens", v.dump(), vocab));
    ids.push_back(v.get<int32_t>());
  }
  Reply r;
  r.body = json{{"content", engine.require_tokenizer().decode(ids)}}.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

Reply Routes::apply_template(std::string_view body) const {
  const CompletionRequest req = parse_chat_request(parse_json_body(body));
  Reply r;
  r.body = json{{"prompt", render_prompt(req, ready_engine())}}.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

Reply Routes::props() const {
  const Engine& e = ready_engine();
  const TemplateKind kind = e.template_kind();
  const bool xml_calls = kind == TemplateKind::Qwen35 || kind == TemplateKind::Qwen36;
  const bool thinking = kind != TemplateKind::Qwen3NextInstruct;
  json p = {{"model", opts_.model_id},
            {"model_type", e.config().model_type},
            {"family", e.config().family_name()},
            {"vocab_size", e.config().vocab_size},
            {"context_length", worker_.options().max_context},
            {"total_slots", worker_.options().parallel > 0 ? worker_.options().parallel : worker_.options().sessions},
            {"chat_template", std::string(template_kind_name(kind))},
            {"capabilities",
             {{"chat", true},
              {"tools", true},
              {"tool_call_format", xml_calls ? "qwen3.5-xml" : "qwen3-json"},
              {"json_schema", true},
              {"thinking", thinking},
              {"anthropic_messages", true}}},
            {"on_miss", e.on_miss().name()},
            {"lossy", e.on_miss().lossy()},
            {"version", std::string(version())}};
  if (std::optional<StateCacheStats> c = worker_.state_cache_stats()) {
    const StateCacheOptions& o = worker_.options().state_cache_options;
    p["state_cache"] = {{"dir", o.dir},
                        {"ram_budget_bytes", o.ram_bytes},
                        {"disk_budget_bytes", o.disk_bytes},
                        {"checkpoint_interval", o.interval},
                        {"hits_ram", c->hits_ram},
                        {"hits_disk", c->hits_disk},
                        {"lookups", c->lookups},
                        {"tokens_saved", c->tokens_saved},
                        {"ram_entries", c->entries_ram},
                        {"ram_bytes", c->bytes_ram},
                        {"disk_files", c->files_disk},
                        {"disk_bytes", c->bytes_disk},
                        {"files_written", c->files_written},
                        {"files_ignored", c->files_ignored}};
  } else {
    p["state_cache"] = nullptr;
  }
  Reply r;
  r.body = p.dump();
  return r;
}

}  // namespace swiftlet::server
