// SPDX-License-Identifier: GPL-2.0
/*
 * nvidia.ko double: the NVIDIA driver's character devices, with the real
 * driver's file-operation entry points, forwarding every call to a user-space
 * server (fake-nvidia-driver --kmod) that keeps the RM state.
 *
 * Nodes: /dev/nvidia0..N-1 (195:0..N-1, region "nvidia", N = the gpus
 * parameter) and /dev/nvidiactl (195:255, region "nvidiactl"), mode 0666,
 * made by devtmpfs through the "nvidia" class; the server's control device
 * /dev/nvidia-double (misc, root only, one server at a time).
 *
 * The entry points nvidia_open, nvidia_close, nvidia_unlocked_ioctl and
 * nvidia_mmap carry the names of NVIDIA's open kernel modules (545 and
 * later) and are global and noinline, so a tracer can kprobe them as it
 * would on a real node.
 *
 * Forwarding (nvd_forward, also used by nvidia-uvm.ko): the calling thread
 * queues a request and sleeps (killable, at most NVD_TIMEOUT) until the
 * server answers. No server: -ENODEV at once. The server closes the control
 * device (exits, is killed): every queued or unanswered call fails with
 * -EIO at once. A request lives on its caller's stack; the lists and every
 * field of a queued request are guarded by nvd_lock, and a caller that stops
 * waiting takes its request off the lists under that lock before returning.
 */
#include <linux/atomic.h>
#include <linux/cdev.h>
#include <linux/completion.h>
#include <linux/device.h>
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pid_namespace.h>
#include <linux/poll.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/uaccess.h>
#include <linux/version.h>

#include "nvidia-double.h"

#define NV_MAJOR		195
#define NV_CTL_MINOR		255
#define NV_MAX_GPUS		8
/* A last resort: a live server answers in microseconds. */
#define NVD_TIMEOUT		(30 * HZ)

static unsigned int gpus = 1;
module_param(gpus, uint, 0444);
MODULE_PARM_DESC(gpus, "Number of /dev/nvidiaN nodes, 1..8 (default 1)");

/* One forwarded call. */
struct nvd_call {
	struct list_head link;	/* on nvd_pending, then on nvd_inflight */
	struct nvd_request req;
	void *data;		/* req.size bytes, the caller's kernel buffer */
	u32 answered;		/* data bytes the answer filled in */
	long ret;
	bool done;
	struct completion answer;
};

static DEFINE_MUTEX(nvd_lock);
static LIST_HEAD(nvd_pending);		/* queued, not yet read by the server */
static LIST_HEAD(nvd_inflight);		/* read, not yet answered */
static DECLARE_WAIT_QUEUE_HEAD(nvd_server_wait);
static bool nvd_attached;
static struct pid_namespace *nvd_server_ns;
static u64 nvd_next_request;
static atomic64_t nvd_file_ids = ATOMIC64_INIT(0);

u64 nvd_new_file_id(void)
{
	return atomic64_inc_return(&nvd_file_ids);
}
EXPORT_SYMBOL_GPL(nvd_new_file_id);

/* Called with nvd_lock held. */
static void nvd_finish(struct nvd_call *call, long ret)
{
	list_del_init(&call->link);
	call->ret = ret;
	call->done = true;
	complete(&call->answer);
}

long nvd_forward(u32 kind, u32 node, u32 minor, u64 file, u32 cmd,
		 void *data, u32 size, u32 *answered)
{
	struct nvd_call call = {
		.req = {
			.magic = NVD_MAGIC,
			.kind = kind,
			.file = file,
			.node = node,
			.minor = minor,
			.cmd = cmd,
			.size = size,
		},
		.data = data,
	};
	long left;

	if (size > NVD_MAX_DATA || (size && !data))
		return -EINVAL;
	INIT_LIST_HEAD(&call.link);
	init_completion(&call.answer);

	mutex_lock(&nvd_lock);
	if (!nvd_attached) {
		mutex_unlock(&nvd_lock);
		return -ENODEV;
	}
	call.req.id = ++nvd_next_request;
	call.req.tgid = task_tgid_nr_ns(current, nvd_server_ns);
	call.req.tid = task_pid_nr_ns(current, nvd_server_ns);
	list_add_tail(&call.link, &nvd_pending);
	mutex_unlock(&nvd_lock);
	wake_up_interruptible(&nvd_server_wait);

	/*
	 * A release must reach the server even from a task being killed (its
	 * files are closed on the way out), so it does not wait killable.
	 */
	if (kind == NVD_RELEASE)
		left = wait_for_completion_timeout(&call.answer, NVD_TIMEOUT);
	else
		left = wait_for_completion_killable_timeout(&call.answer,
							    NVD_TIMEOUT);

	mutex_lock(&nvd_lock);
	if (!call.done) {
		/* Killed or timed out: the server must not see it again. */
		list_del(&call.link);
		call.ret = left < 0 ? -EINTR : -EIO;
		if (left == 0)
			pr_warn_ratelimited("nvidia-double: request %llu (kind %u) not answered in %d s\n",
					    call.req.id, kind, NVD_TIMEOUT / HZ);
	}
	mutex_unlock(&nvd_lock);
	if (answered)
		*answered = call.done ? call.answered : 0;
	return call.ret;
}
EXPORT_SYMBOL_GPL(nvd_forward);

/* ---- the control device ---------------------------------------------- */

static int nvd_ctl_open(struct inode *inode, struct file *file)
{
	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	mutex_lock(&nvd_lock);
	if (nvd_attached) {
		mutex_unlock(&nvd_lock);
		return -EBUSY;
	}
	nvd_attached = true;
	nvd_server_ns = get_pid_ns(task_active_pid_ns(current));
	mutex_unlock(&nvd_lock);
	return 0;
}

static int nvd_ctl_release(struct inode *inode, struct file *file)
{
	struct nvd_call *call, *tmp;

	mutex_lock(&nvd_lock);
	nvd_attached = false;
	list_for_each_entry_safe(call, tmp, &nvd_pending, link)
		nvd_finish(call, -EIO);
	list_for_each_entry_safe(call, tmp, &nvd_inflight, link)
		nvd_finish(call, -EIO);
	put_pid_ns(nvd_server_ns);
	nvd_server_ns = NULL;
	mutex_unlock(&nvd_lock);
	return 0;
}

/* One request per read(); the buffer must hold the largest one. */
static ssize_t nvd_ctl_read(struct file *file, char __user *buf, size_t count,
			    loff_t *ppos)
{
	struct nvd_call *call;
	ssize_t ret;

	if (count < sizeof(struct nvd_request) + NVD_MAX_DATA)
		return -EINVAL;
	mutex_lock(&nvd_lock);
	while (list_empty(&nvd_pending)) {
		mutex_unlock(&nvd_lock);
		if (file->f_flags & O_NONBLOCK)
			return -EAGAIN;
		if (wait_event_interruptible(nvd_server_wait,
					     !list_empty(&nvd_pending)))
			return -ERESTARTSYS;
		mutex_lock(&nvd_lock);
	}
	call = list_first_entry(&nvd_pending, struct nvd_call, link);
	if (copy_to_user(buf, &call->req, sizeof(call->req)) ||
	    copy_to_user(buf + sizeof(call->req), call->data, call->req.size)) {
		ret = -EFAULT;	/* it stays queued */
	} else {
		list_move_tail(&call->link, &nvd_inflight);
		ret = sizeof(call->req) + call->req.size;
	}
	mutex_unlock(&nvd_lock);
	return ret;
}

/* One answer per write(): struct nvd_answer, then its data bytes. */
static ssize_t nvd_ctl_write(struct file *file, const char __user *buf,
			     size_t count, loff_t *ppos)
{
	struct nvd_answer ans;
	struct nvd_call *call;
	ssize_t ret = -ENOENT;	/* the caller stopped waiting */

	if (count < sizeof(ans))
		return -EINVAL;
	if (copy_from_user(&ans, buf, sizeof(ans)))
		return -EFAULT;
	if (ans.size > NVD_MAX_DATA || count != sizeof(ans) + ans.size ||
	    ans.ret > 0 || ans.ret < -MAX_ERRNO)
		return -EINVAL;

	mutex_lock(&nvd_lock);
	list_for_each_entry(call, &nvd_inflight, link) {
		if (call->req.id != ans.id)
			continue;
		if (ans.size > call->req.size) {
			/* A server bug: fail the call rather than let it hang. */
			nvd_finish(call, -EIO);
			ret = -EINVAL;
		} else if (copy_from_user(call->data, buf + sizeof(ans),
					  ans.size)) {
			ret = -EFAULT;	/* it stays in flight */
		} else {
			call->answered = ans.size;
			nvd_finish(call, ans.ret);
			ret = count;
		}
		break;
	}
	mutex_unlock(&nvd_lock);
	return ret;
}

static __poll_t nvd_ctl_poll(struct file *file, poll_table *wait)
{
	__poll_t mask = EPOLLOUT | EPOLLWRNORM;

	poll_wait(file, &nvd_server_wait, wait);
	mutex_lock(&nvd_lock);
	if (!list_empty(&nvd_pending))
		mask |= EPOLLIN | EPOLLRDNORM;
	mutex_unlock(&nvd_lock);
	return mask;
}

static const struct file_operations nvd_ctl_fops = {
	.owner = THIS_MODULE,
	.open = nvd_ctl_open,
	.release = nvd_ctl_release,
	.read = nvd_ctl_read,
	.write = nvd_ctl_write,
	.poll = nvd_ctl_poll,
	.llseek = noop_llseek,
};

static struct miscdevice nvd_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = NVD_CONTROL_NAME,
	.fops = &nvd_ctl_fops,
	.mode = 0600,
};

/* ---- the frontend: nvidiactl and nvidiaN ------------------------------- */

static u32 nv_node(struct inode *inode, u32 *minor)
{
	unsigned int m = iminor(inode);

	if (m == NV_CTL_MINOR) {
		*minor = 0;
		return NVD_NODE_CTL;
	}
	*minor = m;
	return NVD_NODE_GPU;
}

static u64 nv_file_id(struct file *file)
{
	return (u64)(uintptr_t)file->private_data;
}

noinline int nvidia_open(struct inode *inode, struct file *file)
{
	u64 id = nvd_new_file_id();
	u32 node, minor;
	long ret;

	node = nv_node(inode, &minor);
	ret = nvd_forward(NVD_OPEN, node, minor, id, 0, NULL, 0, NULL);
	if (ret)
		return ret;
	file->private_data = (void *)(uintptr_t)id;
	return 0;
}

/* The last reference went: the server frees the file's RM clients now. */
noinline int nvidia_close(struct inode *inode, struct file *file)
{
	u32 node, minor;

	node = nv_node(inode, &minor);
	nvd_forward(NVD_RELEASE, node, minor, nv_file_id(file), 0, NULL, 0,
		    NULL);
	return 0;
}

/*
 * As the real driver does, copy _IOC_SIZE(cmd) bytes in whatever the
 * direction bits say, and the answered bytes back out when the server
 * accepted the call; the RM status travels inside the struct.
 */
noinline long nvidia_unlocked_ioctl(struct file *file, unsigned int cmd,
				    unsigned long arg)
{
	void __user *uarg = (void __user *)arg;
	u32 size = _IOC_SIZE(cmd), answered = 0, node, minor;
	void *buf = NULL;
	long ret;

	if (size > NVD_MAX_DATA)
		return -EINVAL;
	if (size) {
		buf = memdup_user(uarg, size);
		if (IS_ERR(buf))
			return PTR_ERR(buf);
	}
	node = nv_node(file_inode(file), &minor);
	ret = nvd_forward(NVD_IOCTL, node, minor, nv_file_id(file), cmd, buf,
			  size, &answered);
	if (!ret && answered && copy_to_user(uarg, buf, answered))
		ret = -EFAULT;
	kfree(buf);
	return ret;
}

/* The test workloads map only nvidia-uvm; nothing here is mappable. */
noinline int nvidia_mmap(struct file *file, struct vm_area_struct *vma)
{
	return -EINVAL;
}

static const struct file_operations nv_fops = {
	.owner = THIS_MODULE,
	.open = nvidia_open,
	.release = nvidia_close,
	.unlocked_ioctl = nvidia_unlocked_ioctl,
	.mmap = nvidia_mmap,
	.llseek = noop_llseek,
};

static struct cdev nv_gpu_cdev, nv_ctl_cdev;
static struct class *nv_class;

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 2, 0)
static char *nv_devnode(const struct device *dev, umode_t *mode)
#else
static char *nv_devnode(struct device *dev, umode_t *mode)
#endif
{
	if (mode)
		*mode = 0666;
	return NULL;
}

static void nv_destroy_devices(void)
{
	unsigned int i;

	for (i = 0; i < gpus; i++)
		device_destroy(nv_class, MKDEV(NV_MAJOR, i));
	device_destroy(nv_class, MKDEV(NV_MAJOR, NV_CTL_MINOR));
}

static int __init nv_init(void)
{
	struct device *dev;
	unsigned int i;
	int ret;

	if (gpus < 1 || gpus > NV_MAX_GPUS) {
		pr_err("nvidia-double: gpus=%u, must be 1..%d\n", gpus,
		       NV_MAX_GPUS);
		return -EINVAL;
	}
	ret = register_chrdev_region(MKDEV(NV_MAJOR, 0), gpus, "nvidia");
	if (ret)
		return ret;
	ret = register_chrdev_region(MKDEV(NV_MAJOR, NV_CTL_MINOR), 1,
				     "nvidiactl");
	if (ret)
		goto err_gpu_region;
	cdev_init(&nv_gpu_cdev, &nv_fops);
	nv_gpu_cdev.owner = THIS_MODULE;
	ret = cdev_add(&nv_gpu_cdev, MKDEV(NV_MAJOR, 0), gpus);
	if (ret)
		goto err_ctl_region;
	cdev_init(&nv_ctl_cdev, &nv_fops);
	nv_ctl_cdev.owner = THIS_MODULE;
	ret = cdev_add(&nv_ctl_cdev, MKDEV(NV_MAJOR, NV_CTL_MINOR), 1);
	if (ret)
		goto err_gpu_cdev;
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
	nv_class = class_create("nvidia");
#else
	nv_class = class_create(THIS_MODULE, "nvidia");
#endif
	if (IS_ERR(nv_class)) {
		ret = PTR_ERR(nv_class);
		goto err_ctl_cdev;
	}
	nv_class->devnode = nv_devnode;
	for (i = 0; i < gpus; i++) {
		dev = device_create(nv_class, NULL, MKDEV(NV_MAJOR, i), NULL,
				    "nvidia%u", i);
		if (IS_ERR(dev)) {
			ret = PTR_ERR(dev);
			goto err_devices;
		}
	}
	dev = device_create(nv_class, NULL, MKDEV(NV_MAJOR, NV_CTL_MINOR),
			    NULL, "nvidiactl");
	if (IS_ERR(dev)) {
		ret = PTR_ERR(dev);
		goto err_devices;
	}
	ret = misc_register(&nvd_misc);
	if (ret)
		goto err_devices;
	pr_info("nvidia-double: %u GPU node(s); serve with fake-nvidia-driver --kmod\n",
		gpus);
	return 0;

err_devices:
	/* device_destroy() ignores nodes that were never made. */
	nv_destroy_devices();
	class_destroy(nv_class);
err_ctl_cdev:
	cdev_del(&nv_ctl_cdev);
err_gpu_cdev:
	cdev_del(&nv_gpu_cdev);
err_ctl_region:
	unregister_chrdev_region(MKDEV(NV_MAJOR, NV_CTL_MINOR), 1);
err_gpu_region:
	unregister_chrdev_region(MKDEV(NV_MAJOR, 0), gpus);
	return ret;
}

/* No file of ours is open here: each holds a module reference. */
static void __exit nv_exit(void)
{
	misc_deregister(&nvd_misc);
	nv_destroy_devices();
	class_destroy(nv_class);
	cdev_del(&nv_ctl_cdev);
	cdev_del(&nv_gpu_cdev);
	unregister_chrdev_region(MKDEV(NV_MAJOR, NV_CTL_MINOR), 1);
	unregister_chrdev_region(MKDEV(NV_MAJOR, 0), gpus);
}

module_init(nv_init);
module_exit(nv_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Test double of the NVIDIA driver's character devices (gpu-tracer)");
