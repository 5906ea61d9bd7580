// The grammar a chat answer must follow when the request constrains it: a JSON object
// (response_format json_object), a document of a JSON schema (json_schema), or one well-formed
// call of an offered tool (tool_choice required / a named function), in the format of the
// model's template. A prompt that leaves a think block open gets reasoning first: any text
// without '<', then "</think>\n\n".
#pragma once

#include "runtime/grammar.h"
#include "server/api_types.h"

#include <memory>

namespace swiftlet::server {

// Null when the request does not constrain the answer. Throws ApiError (400) naming the
// parameter for a schema the compiler refuses (runtime/json_schema.h lists what it supports).
std::shared_ptr<const Grammar> answer_grammar(const CompletionRequest& req, TemplateKind kind, bool think_opened);

}  // namespace swiftlet::server
