// SPDX-License-Identifier: GPL-2.0
/*
 * nvidia-uvm.ko double: /dev/nvidia-uvm (minor 0) and /dev/nvidia-uvm-tools
 * (minor 1) on a dynamic major (region "nvidia-uvm"), mode 0666, made by
 * devtmpfs through the "nvidia-uvm" class. Opens, releases and ioctls are
 * forwarded through nvidia.ko's nvd_forward(), so nvidia.ko loads first.
 *
 * The entry points carry the real UVM driver's names (uvm_open_entry,
 * uvm_release_entry, uvm_unlocked_ioctl_entry, uvm_mmap_entry, and the managed
 * VMA's uvm_vm_open_managed_entry and uvm_vm_close_managed_entry); static, as
 * there, and noinline, so each is a function of its own in /proc/kallsyms.
 *
 * UVM commands are plain numbers (no _IOC size or direction), so no data
 * travels with them: the server answers by the number alone, and a tracer
 * reads the parameters from the caller's memory itself.
 */
#include <linux/cdev.h>
#include <linux/device.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/version.h>

#include "nvidia-double.h"

#define UVM_MINOR		0
#define UVM_TOOLS_MINOR		1

static dev_t uvm_base;
static struct cdev uvm_cdev;
static struct class *uvm_class;

static u32 uvm_node(struct inode *inode)
{
	return iminor(inode) == UVM_TOOLS_MINOR ? NVD_NODE_UVM_TOOLS
						: NVD_NODE_UVM;
}

static u64 uvm_file_id(struct file *filp)
{
	return (u64)(uintptr_t)filp->private_data;
}

static noinline int uvm_open_entry(struct inode *inode, struct file *filp)
{
	u64 id = nvd_new_file_id();
	long ret;

	ret = nvd_forward(NVD_OPEN, uvm_node(inode), 0, id, 0, NULL, 0, NULL);
	if (ret)
		return ret;
	filp->private_data = (void *)(uintptr_t)id;
	return 0;
}

static noinline int uvm_release_entry(struct inode *inode, struct file *filp)
{
	nvd_forward(NVD_RELEASE, uvm_node(inode), 0, uvm_file_id(filp), 0,
		    NULL, 0, NULL);
	return 0;
}

static noinline long uvm_unlocked_ioctl_entry(struct file *filp,
					      unsigned int cmd,
					      unsigned long arg)
{
	return nvd_forward(NVD_IOCTL, uvm_node(file_inode(filp)), 0,
			   uvm_file_id(filp), cmd, NULL, 0, NULL);
}

/* The workloads reserve managed ranges but never touch them. */
static vm_fault_t uvm_vm_fault(struct vm_fault *vmf)
{
	return VM_FAULT_SIGBUS;
}

/*
 * The managed VMA's open (a copy or split of it) and close (its munmap, or
 * the process's exit), with the real driver's names (515-595), where
 * driver-entry mode sees a managed mapping go away.
 */
static noinline void uvm_vm_open_managed_entry(struct vm_area_struct *vma)
{
	barrier();
}

static noinline void uvm_vm_close_managed_entry(struct vm_area_struct *vma)
{
	barrier();
}

static const struct vm_operations_struct uvm_vm_ops = {
	.open = uvm_vm_open_managed_entry,
	.close = uvm_vm_close_managed_entry,
	.fault = uvm_vm_fault,
};

/* Any offset (the workloads pass offset == address); the mapping holds the file. */
static noinline int uvm_mmap_entry(struct file *filp,
				   struct vm_area_struct *vma)
{
	if (uvm_node(file_inode(filp)) != NVD_NODE_UVM)
		return -EINVAL;
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
	vm_flags_set(vma, VM_DONTEXPAND | VM_DONTDUMP);
#else
	vma->vm_flags |= VM_DONTEXPAND | VM_DONTDUMP;
#endif
	vma->vm_ops = &uvm_vm_ops;
	return 0;
}

static const struct file_operations uvm_fops = {
	.owner = THIS_MODULE,
	.open = uvm_open_entry,
	.release = uvm_release_entry,
	.unlocked_ioctl = uvm_unlocked_ioctl_entry,
	.mmap = uvm_mmap_entry,
	.llseek = noop_llseek,
};

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 2, 0)
static char *uvm_devnode(const struct device *dev, umode_t *mode)
#else
static char *uvm_devnode(struct device *dev, umode_t *mode)
#endif
{
	if (mode)
		*mode = 0666;
	return NULL;
}

static int __init uvm_init(void)
{
	struct device *dev;
	int ret;

	ret = alloc_chrdev_region(&uvm_base, 0, 2, "nvidia-uvm");
	if (ret)
		return ret;
	cdev_init(&uvm_cdev, &uvm_fops);
	uvm_cdev.owner = THIS_MODULE;
	ret = cdev_add(&uvm_cdev, uvm_base, 2);
	if (ret)
		goto err_region;
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
	uvm_class = class_create("nvidia-uvm");
#else
	uvm_class = class_create(THIS_MODULE, "nvidia-uvm");
#endif
	if (IS_ERR(uvm_class)) {
		ret = PTR_ERR(uvm_class);
		goto err_cdev;
	}
	uvm_class->devnode = uvm_devnode;
	dev = device_create(uvm_class, NULL, uvm_base + UVM_MINOR, NULL,
			    "nvidia-uvm");
	if (IS_ERR(dev)) {
		ret = PTR_ERR(dev);
		goto err_class;
	}
	dev = device_create(uvm_class, NULL, uvm_base + UVM_TOOLS_MINOR, NULL,
			    "nvidia-uvm-tools");
	if (IS_ERR(dev)) {
		ret = PTR_ERR(dev);
		goto err_uvm_dev;
	}
	return 0;

err_uvm_dev:
	device_destroy(uvm_class, uvm_base + UVM_MINOR);
err_class:
	class_destroy(uvm_class);
err_cdev:
	cdev_del(&uvm_cdev);
err_region:
	unregister_chrdev_region(uvm_base, 2);
	return ret;
}

static void __exit uvm_exit(void)
{
	device_destroy(uvm_class, uvm_base + UVM_TOOLS_MINOR);
	device_destroy(uvm_class, uvm_base + UVM_MINOR);
	class_destroy(uvm_class);
	cdev_del(&uvm_cdev);
	unregister_chrdev_region(uvm_base, 2);
}

module_init(uvm_init);
module_exit(uvm_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Test double of the NVIDIA UVM driver's character devices (gpu-tracer)");
