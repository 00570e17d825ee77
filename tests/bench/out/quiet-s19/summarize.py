import re,collections,sys,statistics as st
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
    m=re.match(r'(\w+) s(\d+) (steady|M\^k) +([\d.]+)x +k=(\d)',l)
    if not m: continue
    v,s,suite,mul,k=m.groups()
    f=lambda p: float(re.search(p,l).group(1))
    d[(suite,mul,k,v)].append((f(r'\(\s*([\d.]+)% of ideal'),f(r'X refused at entry ([\d.]+)%'),f(r'c/n/b ([\d.]+)'),f(r'Y ([\d.]+)%'),f(r'X ([-\d.]+) pp'),f(r'wasted upstream ([\d.]+)%'),'e-door ' in l))
for key in sorted(d):
    r=d[key]
    med=lambda i: st.median([x[i] for x in r])
    print(key, len(r), 'goodput med %.1f min %.1f'%(med(0),min(x[0] for x in r)),'| atE med %.1f'%med(1),'| top med %.1f min %.1f'%(med(2),min(x[2] for x in r)),'| Y min %.1f'%min(x[3] for x in r),'| pp med %.1f'%med(4),'| waste med %.1f'%med(5),'| e-door runs',sum(x[6] for x in r))
