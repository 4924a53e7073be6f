#include "io/syscall_filter.h"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ckpt {
namespace {

#if defined(__x86_64__)
constexpr uint32_t kArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr uint32_t kArch = AUDIT_ARCH_AARCH64;
#else
constexpr uint32_t kArch = 0;  // no filter
#endif

// Calls refused outright. Each is named only where this architecture has it
// (aarch64 has no open, fork, unlink, ...: only their *at forms).
const std::vector<long>& refused_calls() {
  static const std::vector<long> calls = {
      // programs and processes (a thread would need clone too)
      SYS_execve,
      SYS_execveat,
      SYS_clone,
      SYS_clone3,
      SYS_ptrace,
      SYS_process_vm_writev,
      SYS_process_vm_readv,
#ifdef SYS_fork
      SYS_fork,
#endif
#ifdef SYS_vfork
      SYS_vfork,
#endif
      // the network
      SYS_socket,
      SYS_socketpair,
      SYS_connect,
      SYS_bind,
      SYS_listen,
      SYS_accept,
      SYS_accept4,
      // the file system (opening for writing is checked below)
      SYS_unlinkat,
      SYS_renameat,
      SYS_renameat2,
      SYS_linkat,
      SYS_symlinkat,
      SYS_mkdirat,
      SYS_mknodat,
      SYS_fchmod,
      SYS_fchmodat,
      SYS_fchown,
      SYS_fchownat,
      SYS_truncate,
      SYS_ftruncate,
      SYS_openat2,
      SYS_open_by_handle_at,
      SYS_mount,
      SYS_umount2,
      SYS_pivot_root,
      SYS_chroot,
#ifdef SYS_unlink
      SYS_unlink,
      SYS_rename,
      SYS_link,
      SYS_symlink,
      SYS_mkdir,
      SYS_mknod,
      SYS_rmdir,
      SYS_chmod,
      SYS_chown,
      SYS_lchown,
      SYS_creat,
#endif
      // identity, namespaces, the kernel
      SYS_setuid,
      SYS_setgid,
      SYS_setreuid,
      SYS_setregid,
      SYS_setresuid,
      SYS_setresgid,
      SYS_setgroups,
      SYS_setns,
      SYS_unshare,
      SYS_bpf,
      SYS_perf_event_open,
      SYS_keyctl,
      SYS_init_module,
      SYS_finit_module,
      SYS_delete_module,
      SYS_kexec_load,
      SYS_reboot,
      SYS_swapon,
      SYS_swapoff,
      SYS_io_uring_setup,
  };
  return calls;
}

constexpr uint32_t kWriteFlags = O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND | 020000000 /* __O_TMPFILE */;

// The low 32 bits of argument i (little-endian, as on both architectures).
constexpr uint32_t arg_low(int i) { return offsetof(seccomp_data, args) + 8 * static_cast<uint32_t>(i); }

sock_filter stmt(uint16_t code, uint32_t k) { return BPF_STMT(code, k); }
sock_filter jump(uint16_t code, uint32_t k, uint8_t jt, uint8_t jf) { return BPF_JUMP(code, k, jt, jf); }

}  // namespace

bool forbid_side_effects() {
  if (kArch == 0) return false;
  const uint32_t refuse = SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA);
  const uint32_t self = static_cast<uint32_t>(::getpid());
  std::vector<sock_filter> prog = {
      // Another architecture's numbering (i386 on x86_64) would get past the
      // list: refused, as is the x32 ABI.
      stmt(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      jump(BPF_JMP | BPF_JEQ | BPF_K, kArch, 1, 0),
      stmt(BPF_RET | BPF_K, refuse),
      stmt(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      jump(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 1),
      stmt(BPF_RET | BPF_K, refuse),
  };
  for (long nr : refused_calls()) {
    prog.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 1));
    prog.push_back(stmt(BPF_RET | BPF_K, refuse));
  }
  // open/openat for writing: refused; for reading: allowed (nothing below
  // concerns them).
  auto flags_check = [&](long nr, int flags_arg) {
    prog.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 4));
    prog.push_back(stmt(BPF_LD | BPF_W | BPF_ABS, arg_low(flags_arg)));
    prog.push_back(jump(BPF_JMP | BPF_JSET | BPF_K, kWriteFlags, 0, 1));
    prog.push_back(stmt(BPF_RET | BPF_K, refuse));
    prog.push_back(stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  };
  flags_check(SYS_openat, 2);
#ifdef SYS_open
  flags_check(SYS_open, 1);
#endif
  // Signals only to itself (abort() and raise() send one with tgkill).
  auto self_only = [&](long nr) {
    prog.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 4));
    prog.push_back(stmt(BPF_LD | BPF_W | BPF_ABS, arg_low(0)));
    prog.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, self, 1, 0));
    prog.push_back(stmt(BPF_RET | BPF_K, refuse));
    prog.push_back(stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  };
  for (long nr : {long{SYS_kill}, long{SYS_tgkill}, long{SYS_tkill}}) self_only(nr);
  prog.push_back(stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));

  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return false;
  sock_fprog fprog{static_cast<unsigned short>(prog.size()), prog.data()};
  return ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog) == 0;
}

}  // namespace ckpt
