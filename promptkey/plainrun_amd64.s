#include "textflag.h"

// func plainRunAVX2(p *byte, n int) int
//
// Returns the index of the first byte of p[:n] that is not printable ASCII other than '"' and '\\' (a
// control character, '"', '\\' or >= 0x80), looking at whole 32-byte blocks only; when none has such a
// byte, the length of those blocks (n rounded down to 32). Requires AVX2.
TEXT ·plainRunAVX2(SB), NOSPLIT, $0-24
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	XORQ AX, AX
	MOVL $0x1f, DX
	MOVQ DX, X1
	VPBROADCASTB X1, Y1 // bytes above 0x1f, taken as signed, are 0x20-0x7f
	MOVL $0x22, DX
	MOVQ DX, X2
	VPBROADCASTB X2, Y2 // '"'
	MOVL $0x5c, DX
	MOVQ DX, X3
	VPBROADCASTB X3, Y3 // '\\'

loop64:
	MOVQ CX, DX
	SUBQ AX, DX
	CMPQ DX, $64
	JB   loop32
	VMOVDQU (SI)(AX*1), Y0
	VMOVDQU 32(SI)(AX*1), Y7
	VPCMPGTB Y1, Y0, Y4 // 0xff where 0x20 <= byte <= 0x7f
	VPCMPEQB Y2, Y0, Y5
	VPCMPEQB Y3, Y0, Y6
	VPOR     Y5, Y6, Y5
	VPANDN   Y4, Y5, Y5 // plain bytes
	VPCMPGTB Y1, Y7, Y8
	VPCMPEQB Y2, Y7, Y9
	VPCMPEQB Y3, Y7, Y10
	VPOR     Y9, Y10, Y9
	VPANDN   Y8, Y9, Y9
	VPAND    Y5, Y9, Y10
	VPMOVMSKB Y10, DX
	CMPL DX, $0xffffffff
	JNE  found64
	ADDQ $64, AX
	JMP  loop64

found64:
	VPMOVMSKB Y5, DX
	CMPL DX, $0xffffffff
	JNE  found
	ADDQ $32, AX
	VPMOVMSKB Y9, DX
	JMP  found

loop32:
	CMPQ DX, $32
	JB   done
	VMOVDQU (SI)(AX*1), Y0
	VPCMPGTB Y1, Y0, Y4
	VPCMPEQB Y2, Y0, Y5
	VPCMPEQB Y3, Y0, Y6
	VPOR     Y5, Y6, Y5
	VPANDN   Y4, Y5, Y5
	VPMOVMSKB Y5, DX
	CMPL DX, $0xffffffff
	JNE  found
	ADDQ $32, AX
	JMP  done

found:
	NOTL DX
	BSFL DX, DX
	ADDQ DX, AX

done:
	VZEROUPPER
	MOVQ AX, ret+16(FP)
	RET
