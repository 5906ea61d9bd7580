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
/* The conversation and the model's state into a file, and back (see swiftlet::api::Chat::save);
 * 0 on success, -1 on error. */
int swiftlet_chat_save(swiftlet_chat* chat, const char* path);
int swiftlet_chat_load(swiftlet_chat* chat, const char* path);

/* Several generations stepped together (see swiftlet::api::Batch). */
typedef struct swiftlet_batch swiftlet_batch;
swiftlet_batch* swiftlet_batch_new(swiftlet_engine* engine, int max_sequences);
void swiftlet_batch_free(swiftlet_batch* batch);
/* A raw-text generation (greedy when greedy != 0); returns its id (> 0), or -1. */
long long swiftlet_batch_add(swiftlet_batch* batch, const char* prompt, int max_new_tokens, int greedy,
                             swiftlet_text_fn fn, void* user);
/* The next turn of a chat; returns its id (> 0), or -1. */
long long swiftlet_batch_add_chat(swiftlet_batch* batch, swiftlet_chat* chat, const char* user_text,
                                  int max_new_tokens, swiftlet_text_fn fn, void* user);
/* One step; returns the number of members still generating, or -1 when one failed (then
 * swiftlet_last_error() says why; the others go on). Answers arrive through the callbacks. */
int swiftlet_batch_step(swiftlet_batch* batch);
void swiftlet_batch_cancel(swiftlet_batch* batch, long long id);
/* The last error message of this thread ("" if none). */
const char* swiftlet_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
