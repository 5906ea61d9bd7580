/* The C API: one question, streamed. build/bin/swiftlet-example-c MODEL.qpack */
#include <swiftlet/swiftlet_c.h>

#include <stdio.h>

static int print_piece(const char* piece, int length, void* user) {
  (void)user;
  fwrite(piece, 1, (size_t)length, stdout);
  fflush(stdout);
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL\n", argv[0]);
    return 2;
  }
  swiftlet_engine* engine = swiftlet_open(argv[1], NULL);
  if (!engine) {
    fprintf(stderr, "error: %s\n", swiftlet_last_error());
    return 1;
  }
  swiftlet_chat* chat = swiftlet_chat_new(engine, NULL);
  int n = chat ? swiftlet_chat_send(chat, "Hello!", 16, print_piece, NULL) : -1;
  if (n < 0) fprintf(stderr, "error: %s\n", swiftlet_last_error());
  printf("\n[%d tokens]\n", n);
  swiftlet_chat_free(chat);
  swiftlet_close(engine);
  return n < 0;
}
