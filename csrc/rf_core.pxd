# Byte-level C kernels (csrc/rf_core.h): frame check, message parse, search.
from libc.stdint cimport int64_t, uint32_t, uint64_t

cdef extern from "rf_core.h" nogil:
    enum:
        RF_PREFIX_LEN
        RF_ID_OFF
        RF_OK
        RF_BAD_PREFIX
        RF_BAD_HEX
        RF_BAD_CHECKSUM
        RF_BAD_REST
        RF_TOO_LONG
        RF_NOT_MESSAGE
        RF_BAD_FIELDS
        RF_SEQ_ORDER
    size_t RF_MAX_LINE

    ctypedef struct rf_msg:
        int kind
        uint32_t id_off, id_len
        uint32_t ch_off, ch_len
        uint32_t task_off, task_len
        uint32_t hlc_off, hlc_len
        uint32_t content_off
        uint32_t content_len

    ctypedef struct rf_i64vec:
        int64_t *v
        size_t n, cap

    ctypedef struct rf_scan_result:
        int64_t good_end
        int64_t torn_offset
        int64_t damaged_offset
        int damage
        int oom

    const char *rf_reason(int code)
    int64_t rf_line_seq(const unsigned char *p, size_t len)
    void rf_write_prefix(const unsigned char *rest, size_t n, unsigned char *out)
    int rf_check_frame(const unsigned char *p, size_t len)
    int rf_all_zero(const unsigned char *p, size_t n)
    int rf_parse_msg(const unsigned char *p, size_t len, rf_msg *m, int full)
    int rf_cmp_bytes(const unsigned char *a, size_t na, const unsigned char *b, size_t nb)
    int rf_cmp_json(const unsigned char *a, size_t na, const unsigned char *b, size_t nb)
    unsigned char rf_lower(unsigned char c)
    uint32_t rf_gram(unsigned char a, unsigned char b, unsigned char c, int lg)
    enum: RF_GRAM_ACC_BITS
    ctypedef struct rf_gram_acc:
        int lg
    void rf_gram_acc_init(rf_gram_acc *a, uint64_t *w, int lg)
    void rf_gram_acc_add(rf_gram_acc *a, const unsigned char *p, size_t n)
    void rf_gram_acc_roll(rf_gram_acc *a, uint32_t *x, int *seen, const unsigned char *p, size_t n)
    void rf_gram_acc_done(rf_gram_acc *a)
    int rf_pow2_log(int64_t n, int64_t lo)
    int rf_gram_may(const uint64_t *w, const unsigned char *nd, size_t m, int lg)
    const unsigned char *rf_find(const unsigned char *h, size_t n,
                                 const unsigned char *nd, size_t m, int ci)
    int rf_has_nonascii(const unsigned char *h, size_t n)
    const unsigned char *rf_find_nonascii(const unsigned char *h, size_t n)
    void rf_prefault(const unsigned char *p, size_t n)
    uint64_t rf_check_slots(const uint64_t *slots, uint64_t n, const uint64_t *live, uint32_t n_entries,
                            uint64_t *used)
    uint64_t rf_first_negative(const int64_t *a, uint64_t n)
    void rf_prefetch(const void *p)
    const unsigned char *rf_line_start(const unsigned char *lo, const unsigned char *p)
    int rf_content_has(const unsigned char *s, const unsigned char *e,
                       const unsigned char *nd, size_t m, int ci)
    int rf_i64vec_push(rf_i64vec *a, int64_t x)
    void rf_scan(const unsigned char *buf, int64_t start, int64_t end,
                 rf_i64vec *offs, rf_i64vec *lens, rf_scan_result *r)
