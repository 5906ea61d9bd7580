/* swiftlet C API: a thin wrapper over the C++ one for other languages' FFIs.
 * Functions return NULL / a negative number on error; swiftlet_last_error() says why. */
#ifndef SWIFTLET_C_H
#define SWIFTLET_C_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct swiftlet_engine swiftlet_engine;
typedef struct swiftlet_chat swiftlet_chat;
/* Return 0 to stop generating. */
typedef int (*swiftlet_text_fn)(const char* piece, int length, void* user);

/* backend: "cpu" or "reference" (NULL: cpu). */
swiftlet_engine* swiftlet_open(const char* model_path, const char* backend);
void swiftlet_close(swiftlet_engine* engine);
swiftlet_chat* swiftlet_chat_new(swiftlet_engine* engine, const char* system_prompt);
void swiftlet_chat_free(swiftlet_chat* chat);
/* Streams the answer through fn; returns the number of generated tokens, or -1. */
int swiftlet_chat_send(swiftlet_chat* chat, const char* user_text, int max_new_tokens,
                       swiftlet_text_fn fn, void* user);
void swiftlet_chat_cancel(swiftlet_chat* chat);
/* The last error message of this thread ("" if none). */
const char* swiftlet_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
