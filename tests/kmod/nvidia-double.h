/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The forwarding protocol between the NVIDIA driver double (nvidia.ko,
 * nvidia-uvm.ko) and its user-space server (fake-nvidia-driver --kmod).
 *
 * The modules keep no RM state: every open, release and ioctl of a device
 * node becomes one request that the server read()s from the control device
 * /dev/nvidia-double; the server write()s one answer per request, and the
 * calling thread sleeps until it arrives. The Rust mirror of these structs
 * is tests/src/fake_driver/kmod.rs; change both together (and NVD_MAGIC).
 */
#ifndef NVIDIA_DOUBLE_H
#define NVIDIA_DOUBLE_H

#include <linux/types.h>

/* "NVD1": the first field of every request. */
#define NVD_MAGIC		0x3144564eU
/* The control device's name (a misc device: /dev/nvidia-double). */
#define NVD_CONTROL_NAME	"nvidia-double"
/* Most data bytes a request or answer carries (an ioctl's _IOC_SIZE). */
#define NVD_MAX_DATA		4096U

enum nvd_kind {
	NVD_OPEN = 1,
	NVD_RELEASE = 2,
	NVD_IOCTL = 3,
};

enum nvd_node {
	NVD_NODE_CTL = 0,	/* /dev/nvidiactl (195:255) */
	NVD_NODE_GPU = 1,	/* /dev/nvidia<minor> (195:minor) */
	NVD_NODE_UVM = 2,	/* /dev/nvidia-uvm */
	NVD_NODE_UVM_TOOLS = 3,	/* /dev/nvidia-uvm-tools */
};

/*
 * What read() returns: this header, then `size` data bytes. The read buffer
 * must hold sizeof(struct nvd_request) + NVD_MAX_DATA bytes.
 */
struct nvd_request {
	__u32 magic;	/* NVD_MAGIC */
	__u32 kind;	/* enum nvd_kind */
	__u64 id;	/* echoed in the answer */
	__u64 file;	/* one id per open file description, never reused */
	__u32 node;	/* enum nvd_node */
	__u32 minor;	/* the GPU's minor for NVD_NODE_GPU, else 0 */
	__u32 tgid;	/* the caller, in the server's pid namespace */
	__u32 tid;	/* 0 if the caller is not visible there */
	__u32 cmd;	/* the ioctl command (NVD_IOCTL) */
	__u32 size;	/* data bytes following the header */
};

/*
 * What write() takes: this header, then `size` data bytes (at most the
 * request's size; for an ioctl that succeeds they are copied back to the
 * caller's argument). One answer per write().
 */
struct nvd_answer {
	__u64 id;	/* the request's id */
	__s32 ret;	/* 0 or -errno: what the caller's syscall returns */
	__u32 size;	/* data bytes following the header */
};

#ifdef __KERNEL__
/*
 * Exported by nvidia.ko for nvidia-uvm.ko. nvd_forward() sends one request
 * and waits for its answer; it returns the answer's ret, or -ENODEV (no
 * server), -EIO (the server went away or timed out), -EINTR (the caller was
 * killed). On success `data` holds the answered bytes and *answered their
 * count (may be NULL).
 */
u64 nvd_new_file_id(void);
long nvd_forward(u32 kind, u32 node, u32 minor, u64 file, u32 cmd,
		 void *data, u32 size, u32 *answered);

/* nvidia.ko's file operations, under the real driver's names (545+). */
struct file;
struct inode;
struct vm_area_struct;
int nvidia_open(struct inode *inode, struct file *file);
int nvidia_close(struct inode *inode, struct file *file);
long nvidia_unlocked_ioctl(struct file *file, unsigned int cmd,
			   unsigned long arg);
int nvidia_mmap(struct file *file, struct vm_area_struct *vma);
#endif

#endif /* NVIDIA_DOUBLE_H */
