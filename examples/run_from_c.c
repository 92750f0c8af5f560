/* Run a kiln model from C, without Python.
 *
 * Export first (see docs/executables.md):
 *     exe = kiln.build(mod)            # or kiln.load("model.kiln")
 *     exe.export_native("model_dir")   # lib.so, consts.bin, manifest.txt
 * Build and run:
 *     cc -O2 -o run_from_c examples/run_from_c.c -ldl
 *     ./run_from_c model_dir in0.bin [in1.bin ...] out0.bin [out1.bin ...]
 * Inputs and outputs are raw little-endian arrays in C order (numpy's tofile/fromfile).
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int32_t (*entry_fn)(void** inputs, void** outputs, void* workspace, void** consts);

static void die(const char* what, const char* detail) {
  fprintf(stderr, "run_from_c: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  exit(1);
}

/* Bytes of the next array described in the manifest: <itemsize> <ndim> <dims...>. */
static size_t read_array_bytes(FILE* f) {
  long long itemsize, ndim, dim;
  if (fscanf(f, "%lld %lld", &itemsize, &ndim) != 2) die("bad manifest", "array");
  size_t n = (size_t)itemsize;
  for (long long i = 0; i < ndim; i++) {
    if (fscanf(f, "%lld", &dim) != 1) die("bad manifest", "dims");
    n *= (size_t)dim;
  }
  return n;
}

static void* alloc64(size_t n) {
  void* p = aligned_alloc(64, (n + 63) / 64 * 64 + 64);
  if (!p) die("out of memory", NULL);
  return p;
}

static void* read_file(const char* path, size_t want) {
  FILE* f = fopen(path, "rb");
  if (!f) die("cannot open", path);
  void* p = alloc64(want);
  if (want && fread(p, 1, want, f) != want) die("short file", path);
  fclose(f);
  return p;
}

int main(int argc, char** argv) {
  if (argc < 2) die("usage: run_from_c MODEL_DIR INPUTS... OUTPUTS...", NULL);
  char path[4096], word[256], entry_name[256];
  long long version, ws_bytes, n_in, n_out, n_const;

  snprintf(path, sizeof path, "%s/manifest.txt", argv[1]);
  FILE* m = fopen(path, "r");
  if (!m) die("cannot open", path);
  if (fscanf(m, "kiln-native %lld entry %255s workspace %lld inputs %lld", &version, entry_name,
             &ws_bytes, &n_in) != 4 || version != 1)
    die("bad manifest", path);
  size_t* in_bytes = calloc((size_t)n_in + 1, sizeof(size_t));
  for (long long i = 0; i < n_in; i++) {
    if (fscanf(m, "%255s", word) != 1) die("bad manifest", "input name");
    in_bytes[i] = read_array_bytes(m);
  }
  if (fscanf(m, " outputs %lld", &n_out) != 1) die("bad manifest", "outputs");
  size_t* out_bytes = calloc((size_t)n_out + 1, sizeof(size_t));
  for (long long i = 0; i < n_out; i++) out_bytes[i] = read_array_bytes(m);
  if (fscanf(m, " consts %lld", &n_const) != 1) die("bad manifest", "consts");
  long long* const_off = calloc((size_t)n_const + 1, sizeof(long long));
  long long total = 0, nbytes;
  for (long long i = 0; i < n_const; i++) {
    if (fscanf(m, "%lld %lld", &const_off[i], &nbytes) != 2) die("bad manifest", "const");
    if (const_off[i] + nbytes > total) total = const_off[i] + nbytes;
  }
  fclose(m);
  if (argc != 2 + n_in + n_out) die("expected one file per input and per output", NULL);

  snprintf(path, sizeof path, "%s/consts.bin", argv[1]);
  char* const_blob = read_file(path, (size_t)total);
  void** consts = calloc((size_t)n_const + 1, sizeof(void*));
  for (long long i = 0; i < n_const; i++) consts[i] = const_blob + const_off[i];

  void** inputs = calloc((size_t)n_in + 1, sizeof(void*));
  for (long long i = 0; i < n_in; i++) inputs[i] = read_file(argv[2 + i], in_bytes[i]);
  void** outputs = calloc((size_t)n_out + 1, sizeof(void*));
  for (long long i = 0; i < n_out; i++) outputs[i] = alloc64(out_bytes[i]);
  void* workspace = alloc64((size_t)ws_bytes);

  snprintf(path, sizeof path, "%s/lib.so", argv[1]);
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) die("cannot load", dlerror());
  entry_fn entry = (entry_fn)dlsym(lib, entry_name);
  if (!entry) die("missing entry", entry_name);
  if (entry(inputs, outputs, workspace, consts) != 0) {
    /* a check inside a kernel failed (an index out of range): the library says which */
    const char* (*last_error)(void) = (const char* (*)(void))dlsym(lib, "kiln_last_error");
    die("the model failed", last_error ? last_error() : NULL);
  }

  for (long long i = 0; i < n_out; i++) {
    FILE* f = fopen(argv[2 + n_in + i], "wb");
    if (!f || fwrite(outputs[i], 1, out_bytes[i], f) != out_bytes[i]) die("cannot write",
                                                                          argv[2 + n_in + i]);
    fclose(f);
  }
  return 0;
}
