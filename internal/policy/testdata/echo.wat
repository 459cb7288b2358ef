;; echo: answers every call with the JSON its policy_init received as
;; config. Tests bind it with the output they want to see the host handle.
(module
  (memory (export "memory") 2)
  (global $outlen (mut i32) (i32.const 0))
  (func (export "policy_abi_version") (result i32) (i32.const 1))
  ;; the buffer: [1024, 65536)
  (func (export "policy_buffer") (param $n i32) (result i32)
    (if (result i32) (i32.gt_u (local.get $n) (i32.const 64512))
      (then (i32.const 0)) (else (i32.const 1024))))
  ;; keep the config at 65536
  (func (export "policy_init") (param $n i32) (result i32)
    (memory.copy (i32.const 65536) (i32.const 1024) (local.get $n))
    (global.set $outlen (local.get $n))
    (i32.const 0))
  (func (export "policy_eval") (param $n i32) (result i64)
    (i64.or (i64.shl (i64.const 65536) (i64.const 32))
            (i64.extend_i32_u (global.get $outlen)))))
