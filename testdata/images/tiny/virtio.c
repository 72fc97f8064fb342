/*
 * qemu-mcp tiny kernel: polled virtio-mmio drivers (virtio-input, virtio-gpu).
 *
 * Freestanding C, called from kernel.S:
 *   tk_probe()             at boot, after "type 'help' for commands"
 *   tk_input_idle(l, n)    from the shell's idle loop (UART has no data);
 *                          l/n = the partially typed line, reprinted after
 *                          the event lines
 *   tk_cmd_input()         the "input" command
 *   tk_cmd_gfx()           the "gfx" command
 *
 * The same file serves both tiny kernels: riscv64 (tiny/kernel.S) and
 * aarch64 (tiny-aarch64/kernel.S). What differs between the two virt boards
 * (console UART, where the virtio-mmio transports are and how many, the
 * memory barrier) is in the one architecture block below; the drivers
 * themselves are the same code.
 *
 * Everything is polled: interrupts are never enabled, the drivers watch the
 * used rings. The MMU is off (riscv64: satp = 0; aarch64: SCTLR_ELx.M = 0),
 * so the address of a buffer as the code computes it (PC-relative:
 * -mcmodel=medany on riscv64, adrp/add on aarch64) is its physical address.
 * The code must stay position independent: no absolute addresses of our
 * own symbols (no pointer tables, no jump tables); scripts/build-tiny-kernel
 * rejects absolute relocations. Only device addresses are absolute.
 *
 * Both virtio-mmio flavours are supported: version 1 (legacy, QueuePFN and
 * GuestPageSize; what QEMU 7.2 gives by default) and version 2 (modern,
 * QueueDesc/Driver/Device, VIRTIO_F_VERSION_1 negotiated). Guest and device
 * are both little-endian, so no byte swapping is needed either way.
 *
 * Output formats are a contract (tests match on them); see README.md.
 */

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long u64;
typedef int s32;

#define NULL ((void *)0)

/*
 * The architecture block: the board's console UART (polled; CON_TX_READY
 * and CON_TX), its virtio-mmio transports (VIO_BASE + i * VIO_STRIDE,
 * i < VIO_SLOTS, scanned in address order) and the barrier that orders
 * guest RAM against device registers (FENCE).
 */
#if defined(__riscv)
/* riscv64 virt: ns16550 UART, eight transports from 0x10001000. */
#define UART_BASE	0x10000000UL
#define UART_THR	0
#define UART_LSR	5
#define LSR_THRE	0x20
#define CON_TX_READY()	(rd8(UART_BASE, UART_LSR) & LSR_THRE)
#define CON_TX(c)	wr8(UART_BASE, UART_THR, (c))
#define VIO_BASE	0x10001000UL
#define VIO_STRIDE	0x1000UL
#define VIO_SLOTS	8
#define FENCE		"fence iorw, iorw"
#elif defined(__aarch64__)
/* aarch64 virt: PL011 UART (32-bit registers), 32 transports from
 * 0x0a000000, 0x200 apart. dsb sy: RAM writes complete before the
 * register write that hands them to the device, and the other way round. */
#define UART_BASE	0x09000000UL
#define UART_DR		0x000
#define UART_FR		0x018
#define FR_TXFF		0x20
#define CON_TX_READY()	(!(rd32(UART_BASE, UART_FR) & FR_TXFF))
#define CON_TX(c)	wr32(UART_BASE, UART_DR, (c))
#define VIO_BASE	0x0a000000UL
#define VIO_STRIDE	0x200UL
#define VIO_SLOTS	32
#define FENCE		"dsb sy"
#else
#error "tiny kernel: unsupported architecture (riscv64 or aarch64)"
#endif

#define VIO_MAGIC	0x74726976		/* "virt" */

#define R_MAGIC			0x000
#define R_VERSION		0x004
#define R_DEVICE_ID		0x008
#define R_DEV_FEATURES		0x010
#define R_DEV_FEATURES_SEL	0x014
#define R_DRV_FEATURES		0x020
#define R_DRV_FEATURES_SEL	0x024
#define R_GUEST_PAGE_SIZE	0x028		/* legacy only */
#define R_QUEUE_SEL		0x030
#define R_QUEUE_NUM_MAX		0x034
#define R_QUEUE_NUM		0x038
#define R_QUEUE_ALIGN		0x03c		/* legacy only */
#define R_QUEUE_PFN		0x040		/* legacy only */
#define R_QUEUE_READY		0x044		/* modern only */
#define R_QUEUE_NOTIFY		0x050
#define R_INT_STATUS		0x060
#define R_INT_ACK		0x064
#define R_STATUS		0x070
#define R_QUEUE_DESC_LO		0x080		/* modern only, to 0x0a4 */
#define R_QUEUE_DESC_HI		0x084
#define R_QUEUE_DRIVER_LO	0x090
#define R_QUEUE_DRIVER_HI	0x094
#define R_QUEUE_DEVICE_LO	0x0a0
#define R_QUEUE_DEVICE_HI	0x0a4
#define R_CONFIG		0x100

#define ST_ACKNOWLEDGE	1
#define ST_DRIVER	2
#define ST_DRIVER_OK	4
#define ST_FEATURES_OK	8

#define F_VERSION_1_HI	1			/* feature bit 32 = bit 0 of word 1 */

#define DEV_GPU		16
#define DEV_INPUT	18

#define PAGE		4096UL

/* split virtqueue */
#define VRING_DESC_F_NEXT	1
#define VRING_DESC_F_WRITE	2
#define VRING_AVAIL_F_NO_INTERRUPT 1

struct vring_desc {
	u64 addr;
	u32 len;
	u16 flags;
	u16 next;
};

struct vring_used_elem {
	u32 id;
	u32 len;
};

struct vq {
	volatile struct vring_desc *desc;
	volatile u16 *avail;		/* flags, idx, ring[num], used_event */
	volatile u16 *used;		/* flags, idx, then vring_used_elem[num] */
	u16 num;
	u16 last_used;
	u16 avail_idx;
};

/* One device per transport slot. */
enum {
	K_NONE,
	K_KEYBOARD,
	K_TABLET,
	K_MOUSE,
	K_INPUT_OTHER,
	K_GPU,
};

struct dev {
	u64 base;
	u32 version;
	u8 kind;
	u8 ready;			/* queue set up, DRIVER_OK */
	struct vq q;
};

static struct dev devs[VIO_SLOTS];

/* Queue memory: two pages per slot (descriptors + avail ring in the first,
 * used ring in the second: the legacy layout with QueueAlign = 4096). */
#define QMEM_SIZE	(2 * PAGE)
static u8 qmem[VIO_SLOTS][QMEM_SIZE] __attribute__((aligned(4096)));

/* virtio-input */
#define INPUT_QSZ	64
#define EV_SYN		0
#define EV_KEY		1
#define EV_REL		2
#define EV_ABS		3
#define CFG_ID_NAME	0x01
#define CFG_EV_BITS	0x11

struct input_event {
	u16 type;
	u16 code;
	u32 value;
};

static struct input_event evbuf[VIO_SLOTS][INPUT_QSZ] __attribute__((aligned(16)));

/* virtio-gpu */
#define GPU_QSZ		16
#define GPU_W		640
#define GPU_H		480
#define GPU_RES_ID	1
#define GPU_FORMAT	2			/* VIRTIO_GPU_FORMAT_B8G8R8X8_UNORM */

#define CMD_GET_DISPLAY_INFO		0x0100
#define CMD_RESOURCE_CREATE_2D		0x0101
#define CMD_SET_SCANOUT			0x0103
#define CMD_RESOURCE_FLUSH		0x0104
#define CMD_TRANSFER_TO_HOST_2D		0x0105
#define CMD_RESOURCE_ATTACH_BACKING	0x0106
#define RESP_OK_NODATA			0x1100
#define RESP_OK_DISPLAY_INFO		0x1101

struct gpu_hdr {
	u32 type;
	u32 flags;
	u64 fence_id;
	u32 ctx_id;
	u8 ring_idx;
	u8 pad[3];
};

struct gpu_rect {
	u32 x, y, w, h;
};

struct gpu_create_2d {
	struct gpu_hdr hdr;
	u32 resource_id, format, width, height;
};

struct gpu_attach_backing {
	struct gpu_hdr hdr;
	u32 resource_id, nr_entries;
	u64 addr;			/* the one mem entry */
	u32 length, pad;
};

struct gpu_set_scanout {
	struct gpu_hdr hdr;
	struct gpu_rect r;
	u32 scanout_id, resource_id;
};

struct gpu_flush {
	struct gpu_hdr hdr;
	struct gpu_rect r;
	u32 resource_id, pad;
};

struct gpu_transfer {
	struct gpu_hdr hdr;
	struct gpu_rect r;
	u64 offset;
	u32 resource_id, pad;
};

struct gpu_display_info {
	struct gpu_hdr hdr;
	struct {
		struct gpu_rect r;
		u32 enabled, flags;
	} pmodes[16];
};

static union {
	struct gpu_hdr hdr;
	struct gpu_create_2d create;
	struct gpu_attach_backing attach;
	struct gpu_set_scanout scanout;
	struct gpu_flush flush;
	struct gpu_transfer transfer;
} gpu_req __attribute__((aligned(64)));

static union {
	struct gpu_hdr hdr;
	struct gpu_display_info info;
} gpu_resp __attribute__((aligned(64)));

/* The framebuffer: GPU_W x GPU_H, 4 bytes per pixel, in .bss (NOLOAD). */
static u32 fb[GPU_W * GPU_H] __attribute__((aligned(4096)));

static int gpu_slot = -1;		/* first virtio-gpu found */
static int gpu_ready;

/* Poll limits (loop iterations, each one reading guest RAM). */
#define GPU_POLL_LIMIT	(1UL << 30)	/* seconds under TCG: device is dead */
#define SYN_POLL_LIMIT	(1UL << 18)	/* wait for the rest of an event batch */

/* ------------------------------------------------------------------------ */

static inline void fence(void)
{
	__asm__ volatile(FENCE ::: "memory");
}

static inline u32 rd32(u64 base, u32 off)
{
	return *(volatile u32 *)(base + off);
}

static inline void wr32(u64 base, u32 off, u32 v)
{
	*(volatile u32 *)(base + off) = v;
}

static inline u8 rd8(u64 base, u32 off)
{
	return *(volatile u8 *)(base + off);
}

static inline void wr8(u64 base, u32 off, u8 v)
{
	*(volatile u8 *)(base + off) = v;
}

static void zero(void *p, u64 n)
{
	volatile u8 *b = p;

	while (n--)
		*b++ = 0;
}

/* ---- console output ---- */

static void con_putc(char c)
{
	while (!CON_TX_READY())
		;
	CON_TX((u8)c);
}

static void con_puts(const char *s)
{
	while (*s)
		con_putc(*s++);
}

static void con_putn(const char *s, u64 n)
{
	while (n--)
		con_putc(*s++);
}

static void put_udec(u64 v)
{
	char buf[24];
	int i = sizeof(buf);

	do {
		buf[--i] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	con_putn(buf + i, sizeof(buf) - i);
}

static void put_sdec(s32 v)
{
	if (v < 0) {
		con_putc('-');
		put_udec((u64)(-(long)v));
	} else {
		put_udec((u64)v);
	}
}

static void put_hex(u64 v)
{
	char buf[16];
	int i = sizeof(buf);

	do {
		u32 d = v & 15;
		buf[--i] = (char)(d < 10 ? '0' + d : 'a' + d - 10);
		v >>= 4;
	} while (v);
	con_puts("0x");
	con_putn(buf + i, sizeof(buf) - i);
}

/* ---- virtio-mmio transport ---- */

/*
 * Reset the device and walk it to the point where queues can be set up:
 * ACKNOWLEDGE, DRIVER, and (modern) feature negotiation with only
 * VIRTIO_F_VERSION_1, FEATURES_OK. Legacy: no features, GuestPageSize 4096.
 * Returns 0 on success.
 */
static int vio_begin(struct dev *d)
{
	u64 b = d->base;

	wr32(b, R_STATUS, 0);
	while (rd32(b, R_STATUS) != 0)
		;
	wr32(b, R_STATUS, ST_ACKNOWLEDGE);
	wr32(b, R_STATUS, ST_ACKNOWLEDGE | ST_DRIVER);
	if (d->version == 1) {
		wr32(b, R_DRV_FEATURES_SEL, 0);
		wr32(b, R_DRV_FEATURES, 0);
		wr32(b, R_GUEST_PAGE_SIZE, PAGE);
		return 0;
	}
	wr32(b, R_DEV_FEATURES_SEL, 1);
	if (!(rd32(b, R_DEV_FEATURES) & F_VERSION_1_HI))
		return -1;
	wr32(b, R_DRV_FEATURES_SEL, 0);
	wr32(b, R_DRV_FEATURES, 0);
	wr32(b, R_DRV_FEATURES_SEL, 1);
	wr32(b, R_DRV_FEATURES, F_VERSION_1_HI);
	wr32(b, R_STATUS, ST_ACKNOWLEDGE | ST_DRIVER | ST_FEATURES_OK);
	if (!(rd32(b, R_STATUS) & ST_FEATURES_OK))
		return -1;
	return 0;
}

/* Set up queue qi with at most want (a power of two <= 64) entries in the
 * slot's queue memory. Returns 0 on success. */
static int vio_queue(struct dev *d, int slot, u32 qi, u32 want)
{
	u64 b = d->base;
	u8 *mem = qmem[slot];
	u64 m = (u64)mem;
	u32 max, num;

	wr32(b, R_QUEUE_SEL, qi);
	max = rd32(b, R_QUEUE_NUM_MAX);
	if (max == 0)
		return -1;
	if (d->version == 1 ? rd32(b, R_QUEUE_PFN) : rd32(b, R_QUEUE_READY))
		return -1;
	num = want;
	while (num > max)
		num >>= 1;

	zero(mem, QMEM_SIZE);
	d->q.num = (u16)num;
	d->q.last_used = 0;
	d->q.avail_idx = 0;
	d->q.desc = (volatile struct vring_desc *)mem;
	d->q.avail = (volatile u16 *)(mem + 16 * num);
	d->q.used = (volatile u16 *)(mem + PAGE);
	d->q.avail[0] = VRING_AVAIL_F_NO_INTERRUPT;

	wr32(b, R_QUEUE_NUM, num);
	if (d->version == 1) {
		wr32(b, R_QUEUE_ALIGN, PAGE);
		wr32(b, R_QUEUE_PFN, (u32)(m / PAGE));
	} else {
		u64 a = m + 16 * num, u = m + PAGE;

		wr32(b, R_QUEUE_DESC_LO, (u32)m);
		wr32(b, R_QUEUE_DESC_HI, (u32)(m >> 32));
		wr32(b, R_QUEUE_DRIVER_LO, (u32)a);
		wr32(b, R_QUEUE_DRIVER_HI, (u32)(a >> 32));
		wr32(b, R_QUEUE_DEVICE_LO, (u32)u);
		wr32(b, R_QUEUE_DEVICE_HI, (u32)(u >> 32));
		wr32(b, R_QUEUE_READY, 1);
	}
	return 0;
}

static void vio_driver_ok(struct dev *d)
{
	u32 st = ST_ACKNOWLEDGE | ST_DRIVER | ST_DRIVER_OK;

	if (d->version != 1)
		st |= ST_FEATURES_OK;
	fence();
	wr32(d->base, R_STATUS, st);
}

/* Make descriptor head id available and (optionally) notify queue 0. */
static void vq_push(struct vq *q, u16 id)
{
	q->avail[2 + q->avail_idx % q->num] = id;
	q->avail_idx++;
	fence();
	q->avail[1] = q->avail_idx;
}

static void vq_notify(struct dev *d)
{
	fence();
	wr32(d->base, R_QUEUE_NOTIFY, 0);
}

/* Is there a used element we have not consumed yet? */
static int vq_has_used(struct vq *q)
{
	return q->used[1] != q->last_used;
}

/* Consume the next used element, return its descriptor id. */
static u32 vq_pop(struct vq *q)
{
	volatile struct vring_used_elem *ring =
	    (volatile struct vring_used_elem *)(q->used + 2);
	u32 id;

	fence();
	id = ring[q->last_used % q->num].id;
	q->last_used++;
	return id;
}

/* The interrupt line is never enabled; acknowledge anyway to keep the
 * device's InterruptStatus tidy. */
static void vio_ack(struct dev *d)
{
	u32 s = rd32(d->base, R_INT_STATUS);

	if (s)
		wr32(d->base, R_INT_ACK, s);
}

/* ---- virtio-input ---- */

/* Size of the config item (select, subsel); 0 if the device has none. */
static u32 input_cfg_size(u64 b, u8 sel, u8 subsel)
{
	wr8(b, R_CONFIG + 0, sel);
	wr8(b, R_CONFIG + 1, subsel);
	return rd8(b, R_CONFIG + 2);
}

/* Classify by the event types the device can send: EV_ABS is a tablet,
 * EV_REL a mouse, plain EV_KEY a keyboard. */
static u8 input_classify(u64 b)
{
	u8 kind = K_INPUT_OTHER;

	if (input_cfg_size(b, CFG_EV_BITS, EV_ABS))
		kind = K_TABLET;
	else if (input_cfg_size(b, CFG_EV_BITS, EV_REL))
		kind = K_MOUSE;
	else if (input_cfg_size(b, CFG_EV_BITS, EV_KEY))
		kind = K_KEYBOARD;
	input_cfg_size(b, 0, 0);
	return kind;
}

static int input_init(struct dev *d, int slot)
{
	struct input_event *ev = evbuf[slot];
	u32 i;

	if (vio_begin(d) || vio_queue(d, slot, 0, INPUT_QSZ))
		return -1;
	for (i = 0; i < d->q.num; i++) {
		d->q.desc[i].addr = (u64)&ev[i];
		d->q.desc[i].len = sizeof(ev[i]);
		d->q.desc[i].flags = VRING_DESC_F_WRITE;
		d->q.desc[i].next = 0;
		vq_push(&d->q, (u16)i);
	}
	vio_driver_ok(d);
	vq_notify(d);
	d->ready = 1;
	return 0;
}

static void print_event(const struct input_event *e)
{
	s32 v = (s32)e->value;

	switch (e->type) {
	case EV_SYN:
		con_puts("input: EV_SYN");
		if (e->code == 0 && v == 0)
			goto out;
		break;
	case EV_KEY:
		con_puts("input: EV_KEY");
		break;
	case EV_REL:
		con_puts("input: EV_REL");
		break;
	case EV_ABS:
		con_puts("input: EV_ABS");
		break;
	default:
		con_puts("input: type=");
		put_udec(e->type);
		break;
	}
	con_puts(" code=");
	put_udec(e->code);
	con_puts(" value=");
	put_sdec(v);
out:
	con_puts("\r\n");
}

/*
 * Called while the shell waits for the UART. Prints every pending input
 * event as one line; a batch of lines starts with "\r\n" (ending the prompt
 * line) and is followed by the prompt and the partially typed line again.
 * A batch per device runs up to its EV_SYN: if the device has published
 * only part of a report, wait (briefly) for the rest.
 */
void tk_input_idle(const char *line, u64 len)
{
	int slot, printed = 0;

	for (slot = 0; slot < VIO_SLOTS; slot++) {
		struct dev *d = &devs[slot];
		struct vq *q = &d->q;
		int got = 0, in_report = 0;
		u64 spin = 0;

		if (!d->ready || d->kind == K_GPU)
			continue;
		for (;;) {
			struct input_event e;
			u32 id;

			if (!vq_has_used(q)) {
				if (!in_report || ++spin > SYN_POLL_LIMIT)
					break;
				continue;
			}
			id = vq_pop(q);
			if (id >= q->num)
				continue;
			e = evbuf[slot][id];
			vq_push(q, (u16)id);
			got = 1;
			if (!printed) {
				con_puts("\r\n");
				printed = 1;
			}
			print_event(&e);
			in_report = !(e.type == EV_SYN && e.code == 0);
			spin = 0;
		}
		if (got) {
			vq_notify(d);
			vio_ack(d);
		}
	}
	if (printed) {
		con_puts("tiny> ");
		con_putn(line, len);
	}
}

void tk_cmd_input(void)
{
	int slot, kbd = 0, tab = 0;

	for (slot = 0; slot < VIO_SLOTS; slot++) {
		if (!devs[slot].ready)
			continue;
		if (devs[slot].kind == K_KEYBOARD)
			kbd = 1;
		else if (devs[slot].kind == K_TABLET)
			tab = 1;
	}
	con_puts("input: keyboard=");
	con_puts(kbd ? "yes" : "no");
	con_puts(" tablet=");
	con_puts(tab ? "yes" : "no");
	con_puts("\r\n");
}

/* ---- virtio-gpu ---- */

/* Send gpu_req (reqlen bytes), wait for the response in gpu_resp and check
 * its type. Prints "gfx: error: ..." and returns -1 on failure. */
static int gpu_cmd(const char *name, u32 reqlen, u32 resplen, u32 want)
{
	struct dev *d = &devs[gpu_slot];
	struct vq *q = &d->q;
	u64 spin = 0;
	u32 got;

	zero(&gpu_resp, sizeof(gpu_resp));
	q->desc[0].addr = (u64)&gpu_req;
	q->desc[0].len = reqlen;
	q->desc[0].flags = VRING_DESC_F_NEXT;
	q->desc[0].next = 1;
	q->desc[1].addr = (u64)&gpu_resp;
	q->desc[1].len = resplen;
	q->desc[1].flags = VRING_DESC_F_WRITE;
	q->desc[1].next = 0;
	vq_push(q, 0);
	vq_notify(d);
	while (!vq_has_used(q)) {
		if (++spin > GPU_POLL_LIMIT) {
			con_puts("gfx: error: ");
			con_puts(name);
			con_puts(" timed out\r\n");
			return -1;
		}
	}
	vq_pop(q);
	vio_ack(d);
	got = ((volatile struct gpu_hdr *)&gpu_resp)->type;
	if (got != want) {
		con_puts("gfx: error: ");
		con_puts(name);
		con_puts(" returned ");
		put_hex(got);
		con_puts("\r\n");
		return -1;
	}
	return 0;
}

static void gpu_hdr_init(u32 type)
{
	zero(&gpu_req, sizeof(gpu_req));
	gpu_req.hdr.type = type;
}

static void gpu_rect_full(struct gpu_rect *r)
{
	r->x = 0;
	r->y = 0;
	r->w = GPU_W;
	r->h = GPU_H;
}

/* Reset the device and bring up a GPU_W x GPU_H scanout 0 backed by fb. */
static int gpu_init(void)
{
	struct dev *d = &devs[gpu_slot];

	d->ready = 0;
	if (vio_begin(d) || vio_queue(d, gpu_slot, 0, GPU_QSZ)) {
		con_puts("gfx: error: virtio-gpu setup failed\r\n");
		return -1;
	}
	vio_driver_ok(d);
	d->ready = 1;

	gpu_hdr_init(CMD_GET_DISPLAY_INFO);
	if (gpu_cmd("GET_DISPLAY_INFO", sizeof(struct gpu_hdr),
		    sizeof(struct gpu_display_info), RESP_OK_DISPLAY_INFO))
		return -1;

	gpu_hdr_init(CMD_RESOURCE_CREATE_2D);
	gpu_req.create.resource_id = GPU_RES_ID;
	gpu_req.create.format = GPU_FORMAT;
	gpu_req.create.width = GPU_W;
	gpu_req.create.height = GPU_H;
	if (gpu_cmd("RESOURCE_CREATE_2D", sizeof(struct gpu_create_2d),
		    sizeof(struct gpu_hdr), RESP_OK_NODATA))
		return -1;

	gpu_hdr_init(CMD_RESOURCE_ATTACH_BACKING);
	gpu_req.attach.resource_id = GPU_RES_ID;
	gpu_req.attach.nr_entries = 1;
	gpu_req.attach.addr = (u64)fb;
	gpu_req.attach.length = sizeof(fb);
	if (gpu_cmd("RESOURCE_ATTACH_BACKING", sizeof(struct gpu_attach_backing),
		    sizeof(struct gpu_hdr), RESP_OK_NODATA))
		return -1;

	gpu_hdr_init(CMD_SET_SCANOUT);
	gpu_rect_full(&gpu_req.scanout.r);
	gpu_req.scanout.scanout_id = 0;
	gpu_req.scanout.resource_id = GPU_RES_ID;
	if (gpu_cmd("SET_SCANOUT", sizeof(struct gpu_set_scanout),
		    sizeof(struct gpu_hdr), RESP_OK_NODATA))
		return -1;
	return 0;
}

/* B8G8R8X8_UNORM: bytes B, G, R, X in memory = 0x00RRGGBB little-endian. */
#define RGB(r, g, b)	((u32)(r) << 16 | (u32)(g) << 8 | (u32)(b))

void tk_cmd_gfx(void)
{
	u32 x, y;

	if (gpu_slot < 0) {
		con_puts("gfx: no virtio-gpu device\r\n");
		return;
	}
	if (!gpu_ready) {
		if (gpu_init())
			return;
		gpu_ready = 1;
	}
	for (y = 0; y < GPU_H; y++) {
		u32 *row = fb + y * GPU_W;
		u32 left = y < GPU_H / 2 ? RGB(255, 0, 0) : RGB(0, 0, 255);
		u32 right = y < GPU_H / 2 ? RGB(0, 255, 0) : RGB(255, 255, 255);

		for (x = 0; x < GPU_W / 2; x++)
			row[x] = left;
		for (; x < GPU_W; x++)
			row[x] = right;
	}
	fence();

	gpu_hdr_init(CMD_TRANSFER_TO_HOST_2D);
	gpu_rect_full(&gpu_req.transfer.r);
	gpu_req.transfer.offset = 0;
	gpu_req.transfer.resource_id = GPU_RES_ID;
	if (gpu_cmd("TRANSFER_TO_HOST_2D", sizeof(struct gpu_transfer),
		    sizeof(struct gpu_hdr), RESP_OK_NODATA))
		goto fail;

	gpu_hdr_init(CMD_RESOURCE_FLUSH);
	gpu_rect_full(&gpu_req.flush.r);
	gpu_req.flush.resource_id = GPU_RES_ID;
	if (gpu_cmd("RESOURCE_FLUSH", sizeof(struct gpu_flush),
		    sizeof(struct gpu_hdr), RESP_OK_NODATA))
		goto fail;

	con_puts("gfx: ");
	put_udec(GPU_W);
	con_putc('x');
	put_udec(GPU_H);
	con_puts(" quadrants red green blue white\r\n");
	return;
fail:
	gpu_ready = 0;			/* next gfx starts over with a reset */
}

/* ---- boot probe ---- */

/*
 * Scan the board's virtio-mmio slots in address order and print one line per
 * virtio-input or virtio-gpu device found. Input devices are started right
 * away (event buffers queued); the GPU is only brought up by "gfx".
 */
void tk_probe(void)
{
	int slot;

	for (slot = 0; slot < VIO_SLOTS; slot++) {
		struct dev *d = &devs[slot];
		u64 b = VIO_BASE + slot * VIO_STRIDE;
		u32 id, ver;

		d->base = b;
		d->kind = K_NONE;
		d->ready = 0;
		if (rd32(b, R_MAGIC) != VIO_MAGIC)
			continue;
		ver = rd32(b, R_VERSION);
		id = rd32(b, R_DEVICE_ID);
		if (ver != 1 && ver != 2)
			continue;
		d->version = ver;
		if (id == DEV_INPUT) {
			d->kind = input_classify(b);
			con_puts("virtio-input: ");
			switch (d->kind) {
			case K_KEYBOARD:
				con_puts("keyboard");
				break;
			case K_TABLET:
				con_puts("tablet");
				break;
			case K_MOUSE:
				con_puts("mouse");
				break;
			default:
				con_puts("other");
				break;
			}
			con_puts(" at ");
			put_hex(b);
			if (input_init(d, slot))
				con_puts(" (setup failed)");
			con_puts("\r\n");
		} else if (id == DEV_GPU) {
			con_puts("virtio-gpu: at ");
			put_hex(b);
			con_puts("\r\n");
			d->kind = K_GPU;
			if (gpu_slot < 0)
				gpu_slot = slot;
		}
	}
}
