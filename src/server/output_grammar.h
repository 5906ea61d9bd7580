// The grammar a chat answer must follow when the request constrains it: a JSON object
// (response_format json_object), a document of a JSON schema (json_schema), or one well-formed
// call of an offered tool (tool_choice required / a named function), in the format of the
// model's template. A prompt that leaves a think block open gets reasoning first: any text
// without '<', then "</think>\n\n".
#pragma once

#include "runtime/grammar.h"
#include "server/api_types.h"

#include <memory>
#include <string>
#include <vector>

namespace swiftlet::server {

struct AnswerGrammar {
  std::shared_ptr<const Grammar> grammar;  // null when the request does not constrain the answer
  // The schema keywords the grammar leaves out (runtime/json_schema.h), each "keyword@pointer"
  // with a JSON pointer into the request body ("minimum@/tools/0/function/parameters/properties/n").
  std::vector<std::string> unenforced;
};

// Throws ApiError (400) naming the parameter and the place for a schema that is not a valid
// JSON Schema; every valid one is accepted.
AnswerGrammar answer_grammar(const CompletionRequest& req, TemplateKind kind, bool think_opened);

// The unenforced list as one HTTP header value: comma-separated, with commas, '%' and bytes
// outside printable ASCII percent-encoded, at most ~4 KB ("+N more" past that).
std::string unenforced_header(const std::vector<std::string>& unenforced);

}  // namespace swiftlet::server
