/* Python stacks read from a process's memory (pyframes.h). */
#define _GNU_SOURCE
#include "operator-agent/pystack/pyframes.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "operator-agent/common/outbuf.h"

#define MAX_THREADS 64
#define MAX_FRAMES 256
#define MAX_TABLE (1 << 20) /* a location table longer than this is not believed */
#define MAX_NAME 512
#define MAX_SYMTAB (64 << 20)

/* Where each field is, from the process (3.13) or fixed (3.11). */
typedef struct {
  int v311;
  uint64_t rt_interp_head, is_threads_head, ts_next, ts_frame, ts_thread_id, cf_current_frame;
  uint64_t fr_previous, fr_code, fr_instr, fr_owner;
  uint64_t co_filename, co_name, co_linetable, co_firstlineno, co_adaptive;
  uint64_t by_size, by_sval, un_state, un_length, un_ascii_size, ob_type;
} offs_t;

/* CPython 3.11 on 64-bit Linux (offsetof in its Include/internal headers). */
static const offs_t OFFS_311 = {
    .v311 = 1,
    .rt_interp_head = 40,  /* _PyRuntimeState.interpreters.head */
    .is_threads_head = 16, /* PyInterpreterState.threads.head */
    .ts_next = 8,          /* PyThreadState.next */
    .ts_frame = 56,        /* PyThreadState.cframe */
    .ts_thread_id = 152,   /* PyThreadState.thread_id */
    .cf_current_frame = 8, /* _PyCFrame.current_frame */
    .fr_previous = 48,     /* _PyInterpreterFrame.previous */
    .fr_code = 32,         /* .f_code */
    .fr_instr = 56,        /* .prev_instr */
    .fr_owner = 69,        /* .owner */
    .co_filename = 112,    /* PyCodeObject.co_filename */
    .co_name = 120,        /* .co_name */
    .co_linetable = 136,   /* .co_linetable */
    .co_firstlineno = 72,  /* .co_firstlineno */
    .co_adaptive = 184,    /* .co_code_adaptive */
    .by_size = 16,         /* PyVarObject.ob_size */
    .by_sval = 32,         /* PyBytesObject.ob_sval */
    .un_state = 32,        /* PyASCIIObject.state */
    .un_length = 16,       /* .length */
    .un_ascii_size = 48,   /* sizeof(PyASCIIObject) */
    .ob_type = 8,          /* PyObject.ob_type */
};

/* _Py_DebugOffsets of 3.13 as 64-bit words (Include/internal/pycore_runtime.h): word 0 is the
 * cookie "xdebugpy", 1 the version; the indices of the fields used here. */
enum {
  DO_VERSION = 1,
  DO_RT_INTERP_HEAD = 5,
  DO_IS_THREADS_HEAD = 9,
  DO_TS_NEXT = 21,
  DO_TS_CURRENT_FRAME = 23,
  DO_TS_THREAD_ID = 24,
  DO_FR_PREVIOUS = 29,
  DO_FR_EXECUTABLE = 30,
  DO_FR_INSTR_PTR = 31,
  DO_FR_OWNER = 33,
  DO_CO_FILENAME = 35,
  DO_CO_NAME = 36,
  DO_CO_LINETABLE = 38,
  DO_CO_FIRSTLINENO = 39,
  DO_CO_ADAPTIVE = 43,
  DO_OB_TYPE = 45,
  DO_BY_SIZE = 65,
  DO_BY_SVAL = 66,
  DO_UN_STATE = 68,
  DO_UN_LENGTH = 69,
  DO_UN_ASCII_SIZE = 70,
  DO_WORDS = 73,
};

#define FRAME_OWNED_BY_CSTACK 3 /* 3.12+: an entry frame of C code, not Python's */

static int rd(pid_t pid, uint64_t addr, void *buf, size_t n) {
  struct iovec l = {buf, n}, r = {(void *)(uintptr_t)addr, n};
  return addr && process_vm_readv(pid, &l, 1, &r, 1, 0) == (ssize_t)n ? 0 : -1;
}

static int rdp(pid_t pid, uint64_t addr, uint64_t *v) {
  *v = 0;
  return rd(pid, addr, v, sizeof *v);
}

/* ---- finding _PyRuntime ---- */

typedef struct {
  uint64_t runtime, version, code_type;
} syms_t;

static int read_at(int fd, uint64_t off, void *buf, size_t n) {
  return pread(fd, buf, n, (off_t)off) == (ssize_t)n ? 0 : -1;
}

/* The dynamic symbols of ELF file fd that matter, as addresses in the process (bias added). */
static int elf_syms(int fd, uint64_t base, syms_t *s) {
  Elf64_Ehdr eh;
  if (read_at(fd, 0, &eh, sizeof eh) || memcmp(eh.e_ident, ELFMAG, SELFMAG) ||
      eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_shentsize != sizeof(Elf64_Shdr) ||
      eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_shnum > 4096 || eh.e_phnum > 256)
    return -1;
  uint64_t first_vaddr = UINT64_MAX;
  for (int i = 0; i < eh.e_phnum; i++) {
    Elf64_Phdr ph;
    if (read_at(fd, eh.e_phoff + (uint64_t)i * sizeof ph, &ph, sizeof ph)) return -1;
    if (ph.p_type == PT_LOAD && ph.p_vaddr - ph.p_offset < first_vaddr)
      first_vaddr = ph.p_vaddr - ph.p_offset;
  }
  if (first_vaddr == UINT64_MAX) return -1;
  uint64_t bias = base - first_vaddr;
  int rc = -1;
  for (int i = 0; i < eh.e_shnum && rc; i++) {
    Elf64_Shdr sh, st;
    if (read_at(fd, eh.e_shoff + (uint64_t)i * sizeof sh, &sh, sizeof sh)) return -1;
    if (sh.sh_type != SHT_DYNSYM || sh.sh_link >= eh.e_shnum ||
        read_at(fd, eh.e_shoff + (uint64_t)sh.sh_link * sizeof st, &st, sizeof st) ||
        sh.sh_size > MAX_SYMTAB || st.sh_size > MAX_SYMTAB)
      continue;
    Elf64_Sym *sym = malloc(sh.sh_size ? sh.sh_size : 1);
    char *str = malloc(st.sh_size + 1);
    if (sym && str && !read_at(fd, sh.sh_offset, sym, sh.sh_size) &&
        !read_at(fd, st.sh_offset, str, st.sh_size)) {
      str[st.sh_size] = 0;
      for (size_t k = 0; k < sh.sh_size / sizeof *sym; k++) {
        if (sym[k].st_name >= st.sh_size || !sym[k].st_value) continue;
        const char *nm = str + sym[k].st_name;
        uint64_t at = bias + sym[k].st_value;
        if (!strcmp(nm, "_PyRuntime")) s->runtime = at;
        if (!strcmp(nm, "Py_Version")) s->version = at;
        if (!strcmp(nm, "PyCode_Type")) s->code_type = at;
      }
      rc = s->runtime ? 0 : -1;
    }
    free(sym);
    free(str);
  }
  return rc;
}

/* The python executable or libpython mapped in pid, and its symbols. */
static int find_runtime(pid_t pid, syms_t *s, char *why, size_t cap) {
  char path[64], line[1024], seen[4][512];
  int nseen = 0;
  snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
  FILE *f = fopen(path, "re");
  if (!f) {
    snprintf(why, cap, "cannot read %s: %s", path, strerror(errno));
    return -1;
  }
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) {
    uint64_t start, end, off;
    int name_at = 0;
    if (sscanf(line, "%" SCNx64 "-%" SCNx64 " %*s %" SCNx64 " %*s %*s %n", &start, &end, &off,
               &name_at) < 3 ||
        !name_at || off != 0)
      continue;
    char *name = line + name_at;
    name[strcspn(name, "\n")] = 0;
    const char *b = strrchr(name, '/');
    b = b ? b + 1 : name;
    if (name[0] != '/' || (strncmp(b, "python3", 7) && strncmp(b, "libpython3", 10))) continue;
    int dup = 0;
    for (int i = 0; i < nseen; i++) dup |= !strcmp(seen[i], name);
    if (dup || nseen == 4) continue;
    snprintf(seen[nseen++], sizeof seen[0], "%s", name);
    /* maps names the file as this process sees it (the kernel prints paths from the reader's
     * root), so a chroot'ed worker's python is found too; map_files is the way for a file that
     * is gone or hidden from here (root only). */
    char file[600];
    int fd = open(name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      snprintf(file, sizeof file, "/proc/%d/map_files/%" PRIx64 "-%" PRIx64, (int)pid, start, end);
      fd = open(file, O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0) continue;
    memset(s, 0, sizeof *s);
    found = elf_syms(fd, start, s) == 0;
    close(fd);
  }
  fclose(f);
  if (!found)
    snprintf(why, cap,
             "not a CPython process: no python3 or libpython3 with _PyRuntime mapped in pid %d",
             (int)pid);
  return found ? 0 : -1;
}

/* The offsets for pid's CPython, or -1 with why. */
static int get_offsets(pid_t pid, const syms_t *s, offs_t *o, char *why, size_t cap) {
  uint64_t v = 0;
  if (!s->version || rdp(pid, s->version, &v)) {
    snprintf(why, cap,
             "cannot read Py_Version in pid %d (CPython before 3.11, or no ptrace access: %s)",
             (int)pid, strerror(errno));
    return -1;
  }
  unsigned major = (unsigned)(v >> 24) & 0xff, minor = (unsigned)(v >> 16) & 0xff;
  if (major == 3 && minor == 11) {
    *o = OFFS_311;
    return 0;
  }
  if (major != 3 || minor != 13) {
    snprintf(why, cap, "CPython %u.%u: stacks from memory are read for 3.11 and 3.13 only", major,
             minor);
    return -1;
  }
  uint64_t w[DO_WORDS];
  if (rd(pid, s->runtime, w, sizeof w) || memcmp(w, "xdebugpy", 8) || w[DO_VERSION] != v) {
    snprintf(why, cap, "CPython 3.13 without its debug offsets at _PyRuntime");
    return -1;
  }
  *o = (offs_t){
      .rt_interp_head = w[DO_RT_INTERP_HEAD],
      .is_threads_head = w[DO_IS_THREADS_HEAD],
      .ts_next = w[DO_TS_NEXT],
      .ts_frame = w[DO_TS_CURRENT_FRAME],
      .ts_thread_id = w[DO_TS_THREAD_ID],
      .fr_previous = w[DO_FR_PREVIOUS],
      .fr_code = w[DO_FR_EXECUTABLE],
      .fr_instr = w[DO_FR_INSTR_PTR],
      .fr_owner = w[DO_FR_OWNER],
      .co_filename = w[DO_CO_FILENAME],
      .co_name = w[DO_CO_NAME],
      .co_linetable = w[DO_CO_LINETABLE],
      .co_firstlineno = w[DO_CO_FIRSTLINENO],
      .co_adaptive = w[DO_CO_ADAPTIVE],
      .by_size = w[DO_BY_SIZE],
      .by_sval = w[DO_BY_SVAL],
      .un_state = w[DO_UN_STATE],
      .un_length = w[DO_UN_LENGTH],
      .un_ascii_size = w[DO_UN_ASCII_SIZE],
      .ob_type = w[DO_OB_TYPE],
  };
  return 0;
}

/* ---- code objects ---- */

static uint32_t varint(const unsigned char *t, size_t n, size_t *i) {
  uint32_t v = 0;
  unsigned shift = 0;
  while (*i < n && shift < 32) {
    unsigned char b = t[(*i)++];
    v |= (uint32_t)(b & 63) << shift;
    shift += 6;
    if (!(b & 64)) break;
  }
  return v;
}

static int svarint(const unsigned char *t, size_t n, size_t *i) {
  uint32_t u = varint(t, n, i);
  return u & 1 ? -(int)(u >> 1) : (int)(u >> 1);
}

int agent_pyframes_addr2line(const unsigned char *t, size_t n, int first_line, int addr) {
  int line = first_line, end = 0;
  size_t i = 0;
  while (i < n) {
    unsigned char b = t[i++];
    if (!(b & 0x80)) return -1; /* not at an entry: a table we misread */
    int code = (b >> 3) & 15, len = (b & 7) + 1, delta = 0;
    if (code == 14) { /* long form: line delta, end line delta, column, end column */
      delta = svarint(t, n, &i);
      varint(t, n, &i);
      varint(t, n, &i);
      varint(t, n, &i);
    } else if (code == 13) { /* no columns */
      delta = svarint(t, n, &i);
    } else if (code >= 10 && code <= 12) { /* one line: delta in the code, two column bytes */
      delta = code - 10;
      i += 2;
    } else if (code < 10) { /* short form: same line, one column byte */
      i += 1;
    }
    line += delta;
    end += len * 2;
    if (addr < end) return code == 15 ? -1 : line;
  }
  return -1;
}

/* An ASCII str object's text (CPython's compact ASCII layout), else a placeholder. */
static void read_str(pid_t pid, const offs_t *o, uint64_t obj, char *out, size_t cap) {
  uint32_t state = 0;
  int64_t len = 0;
  snprintf(out, cap, "?");
  if (rd(pid, obj + o->un_state, &state, sizeof state) ||
      rd(pid, obj + o->un_length, &len, sizeof len) || len < 0)
    return;
  int compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
  if (!compact || !ascii) {
    snprintf(out, cap, "<non-ASCII>");
    return;
  }
  size_t n = (size_t)len < cap - 1 ? (size_t)len : cap - 1;
  if (rd(pid, obj + o->un_ascii_size, out, n)) n = 0;
  out[n] = 0;
  for (size_t k = 0; k < n; k++)
    if ((unsigned char)out[k] < 0x20 || (unsigned char)out[k] >= 0x7f) out[k] = '?';
}

/* The line of the instruction at instr in code object co, or -1. */
static int frame_line(pid_t pid, const offs_t *o, uint64_t co, uint64_t instr) {
  uint64_t tab = 0;
  int32_t first = 0;
  int64_t n = 0;
  if (rdp(pid, co + o->co_linetable, &tab) ||
      rd(pid, co + o->co_firstlineno, &first, sizeof first) ||
      rd(pid, tab + o->by_size, &n, sizeof n) || n <= 0 || n > MAX_TABLE)
    return -1;
  uint64_t start = co + o->co_adaptive;
  if (instr < start || instr - start > (uint64_t)INT32_MAX) return -1;
  unsigned char *t = malloc((size_t)n);
  int line = -1;
  if (t && !rd(pid, tab + o->by_sval, t, (size_t)n))
    line = agent_pyframes_addr2line(t, (size_t)n, first, (int)(instr - start));
  free(t);
  return line;
}

/* ---- the walk ---- */

/* One thread's frames, most recent first. */
static void walk_thread(pid_t pid, const offs_t *o, const syms_t *s, uint64_t ts,
                        agent_outbuf_t *w) {
  uint64_t tid = 0, fr = 0;
  rdp(pid, ts + o->ts_thread_id, &tid);
  agent_outbuf_put(w, "Thread 0x%016" PRIx64 " (most recent call first):\n", tid);
  if (o->v311) {
    uint64_t cf = 0;
    if (!rdp(pid, ts + o->ts_frame, &cf)) rdp(pid, cf + o->cf_current_frame, &fr);
  } else {
    rdp(pid, ts + o->ts_frame, &fr);
  }
  int shown = 0;
  for (int k = 0; fr && k < MAX_FRAMES && !w->full; k++) {
    uint64_t co = 0, instr = 0, prev = 0, type = 0;
    unsigned char owner = 0;
    if (rdp(pid, fr + o->fr_code, &co) || rdp(pid, fr + o->fr_instr, &instr) ||
        rdp(pid, fr + o->fr_previous, &prev) || rd(pid, fr + o->fr_owner, &owner, 1)) {
      agent_outbuf_put(w, "  <frame at 0x%" PRIx64 " unreadable>\n", fr);
      break;
    }
    fr = prev;
    if (owner == FRAME_OWNED_BY_CSTACK || rdp(pid, co + o->ob_type, &type) ||
        (s->code_type && type != s->code_type))
      continue; /* not a Python function's frame */
    char file[MAX_NAME], name[MAX_NAME];
    uint64_t fo = 0, no = 0;
    rdp(pid, co + o->co_filename, &fo);
    rdp(pid, co + o->co_name, &no);
    read_str(pid, o, fo, file, sizeof file);
    read_str(pid, o, no, name, sizeof name);
    int line = frame_line(pid, o, co, instr);
    if (line >= 0)
      agent_outbuf_put(w, "  File \"%s\", line %d in %s\n", file, line, name);
    else
      agent_outbuf_put(w, "  File \"%s\", line ??? in %s\n", file, name);
    shown++;
  }
  if (!shown) agent_outbuf_put(w, "  <no Python frame>\n");
  agent_outbuf_put(w, "\n");
}

ssize_t agent_pyframes_read(pid_t pid, char *out, size_t cap, char *why, size_t why_cap) {
  if (why_cap) why[0] = 0;
  if (cap) out[0] = 0;
  if (cap < 64) {
    snprintf(why, why_cap, "no room for stacks");
    return -1;
  }
  syms_t s;
  offs_t o;
  if (find_runtime(pid, &s, why, why_cap) || get_offsets(pid, &s, &o, why, why_cap)) return -1;
  uint64_t interp = 0, ts = 0;
  if (rdp(pid, s.runtime + o.rt_interp_head, &interp) || !interp ||
      rdp(pid, interp + o.is_threads_head, &ts)) {
    snprintf(why, why_cap, "pid %d: no interpreter in _PyRuntime (not started or finalizing)",
             (int)pid);
    return -1;
  }
  agent_outbuf_t w = {out, 0, cap, 0};
  for (int t = 0; ts && t < MAX_THREADS && !w.full; t++) {
    walk_thread(pid, &o, &s, ts, &w);
    if (rdp(pid, ts + o.ts_next, &ts)) break;
  }
  if (!w.n) {
    snprintf(why, why_cap, "pid %d: no Python thread", (int)pid);
    return -1;
  }
  return (ssize_t)w.n;
}
